"""deploy/k8s: both overlays build, every manifest validates against the Kubernetes API schemas, and the
settings that matter (probes, GPUs, Redis isolation, images) are what the README promises."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ["cpu", "gpu"]
KUBERNETES_VERSION = "1.30.0"  # the oldest version the manifests promise to work on (grpc probes are GA since 1.27)
SERVICES = {"gateway": 50051, "buffer": 50052, "explorer": 50053, "trainer": 50054}


def render(overlay: Path) -> dict[tuple[str, str], dict]:
    """The overlay as `kubectl kustomize` renders it (offline), by (kind, name)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (it renders the Kustomize overlays)")
    done = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(done.stdout) if d}


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request) -> tuple[str, dict]:
    return request.param, render(K8S / "overlays" / request.param)


def _container(docs: dict, name: str) -> dict:
    return docs[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]


def test_every_manifest_validates_against_the_kubernetes_schemas(overlay):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    _, docs = overlay
    for (kind, name), doc in docs.items():
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{kind}/{name}: {err}")


def test_each_service_has_native_grpc_probes_on_its_own_port(overlay):
    _, docs = overlay
    for service, port in SERVICES.items():
        container = _container(docs, service)
        assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"grpc": port, "metrics": 9090}
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["TRINITY_PORT"] == str(port)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"] == {"port": port}, (service, probe)
        assert docs[("Service", service)]["spec"]["ports"][0]["port"] == port


def test_services_run_as_the_images_non_root_user_with_requests(overlay):
    _, docs = overlay
    for service in SERVICES:
        pod = docs[("Deployment", service)]["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
        assert {"cpu", "memory"} <= set(pod["containers"][0]["resources"]["requests"])


def test_gpus_are_requested_only_in_the_gpu_overlay(overlay):
    name, docs = overlay
    for service in SERVICES:
        resources = _container(docs, service)["resources"]
        gpus = resources.get("limits", {}).get("nvidia.com/gpu")
        if name == "gpu" and service in ("explorer", "trainer"):
            assert gpus == "1" and resources["requests"]["nvidia.com/gpu"] == "1"
        else:
            assert gpus is None, service


def test_overlays_pick_the_matching_image_flavour(overlay):
    name, docs = overlay
    flavour = {"cpu": "cpu", "gpu": "cuda"}[name]
    assert _container(docs, "explorer")["image"] == f"trinity/explorer:0.1.0-{flavour}"
    assert _container(docs, "trainer")["image"] == f"trinity/trainer:0.1.0-{flavour}"
    assert _container(docs, "gateway")["image"] == "trinity/gateway:0.1.0"


def test_redis_is_a_stateful_set_with_aof_on_a_claimed_volume(overlay):
    _, docs = overlay
    redis = docs[("StatefulSet", "redis")]
    args = redis["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "redis-data"
    assert docs[("ConfigMap", "trinity-env")]["data"]["TRINITY_REDIS_URL"] == "redis://redis:6379/0"


def test_only_trinity_services_may_reach_redis(overlay):
    _, docs = overlay
    policy = docs[("NetworkPolicy", "redis-from-trinity-services")]["spec"]
    redis_labels = docs[("StatefulSet", "redis")]["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= redis_labels.items()
    (rule,) = policy["ingress"]
    components = {e["key"]: e["values"] for e in rule["from"][0]["podSelector"]["matchExpressions"]}
    assert sorted(components["app.kubernetes.io/component"]) == sorted(SERVICES)
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]


def test_explorers_scale_by_replicas_behind_a_disruption_budget(overlay):
    _, docs = overlay
    explorer = docs[("Deployment", "explorer")]
    assert explorer["spec"]["replicas"] >= 2
    budget = docs[("PodDisruptionBudget", "explorer")]["spec"]
    assert budget["selector"]["matchLabels"].items() <= explorer["spec"]["template"]["metadata"]["labels"].items()
    instance = next(e for e in _container(docs, "explorer")["env"] if e["name"] == "TRINITY_INSTANCE_ID")
    assert instance["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"  # one id per replica


def test_the_auth_token_comes_from_the_secret(overlay):
    _, docs = overlay
    for service in SERVICES:
        token = next(e for e in _container(docs, service)["env"] if e["name"] == "TRINITY_AUTH_TOKEN")
        assert token["valueFrom"]["secretKeyRef"] == {"name": "trinity-auth", "key": "token"}
    assert "token" in docs[("Secret", "trinity-auth")]["stringData"]


def test_everything_namespaced_lands_in_the_trinity_namespace(overlay):
    _, docs = overlay
    for (kind, name), doc in docs.items():
        if kind != "Namespace":
            assert doc["metadata"]["namespace"] == "trinity", f"{kind}/{name}"


def test_the_buffer_mounts_the_quickstart_task_data_kept_equal_to_the_examples(overlay):
    _, docs = overlay
    data = docs[("ConfigMap", "trinity-task-data")]["data"]
    for name in ("train.jsonl", "eval.jsonl"):
        assert data[name] == (ROOT / "examples" / "quickstart" / name).read_text(), name
    mounts = {m["name"]: m for m in _container(docs, "buffer")["volumeMounts"]}
    assert mounts["task-data"]["mountPath"] == "/examples/quickstart" and mounts["task-data"]["readOnly"]


def test_the_served_run_config_is_the_quickstart_with_pod_paths(overlay):
    _, docs = overlay
    served = yaml.safe_load(docs[("ConfigMap", "trinity-run-config")]["data"]["run.yaml"])
    quickstart = yaml.safe_load((ROOT / "examples" / "quickstart" / "config.yaml").read_text())
    assert served["buffer"]["taskset"].pop("path") == "/examples/quickstart/train.jsonl"
    assert served["buffer"]["eval_tasksets"][0].pop("path") == "/examples/quickstart/eval.jsonl"
    del quickstart["buffer"]["taskset"]["path"], quickstart["buffer"]["eval_tasksets"][0]["path"]
    assert served == quickstart


def test_models_and_checkpoints_live_on_the_shared_volume(overlay):
    _, docs = overlay
    for service in ("explorer", "trainer"):
        pod = docs[("Deployment", service)]["spec"]["template"]["spec"]
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v
        }
        mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
        assert claims[mounts["/data"]] == "trinity-data", service  # TRINITY_MODEL_CACHE, TRINITY_RUNS_DIR: /data
    assert docs[("PersistentVolumeClaim", "trinity-data")]["spec"]["accessModes"] == ["ReadWriteMany"]
