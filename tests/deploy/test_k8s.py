"""deploy/k8s: both overlays build, every manifest validates against the Kubernetes API schemas, and the
settings that matter (probes, GPUs, Redis isolation, images, the trainer's ranks) are what the README promises."""

from __future__ import annotations

import base64
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from trinity.config.trainer import TorchTrainerConfig

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ["cpu", "gpu"]
KUBERNETES_VERSION = "1.30.0"  # the oldest version the manifests promise to work on (grpc probes are GA since 1.27)
SERVICES = {"gateway": 50051, "buffer": 50052, "explorer": 50053, "trainer": 50054, "trackers": 50055}
TOKEN = "k8s-test-token"  # what an operator writes to deploy/k8s/base/secrets/token
PROBE = ["python", "-m", "trinity.runtime.healthcheck"]


def kustomize(path: Path) -> subprocess.CompletedProcess[str]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (it renders the Kustomize overlays)")
    return subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True)


def render(path: Path) -> dict[tuple[str, str], dict]:
    """The kustomization as `kubectl kustomize` renders it (offline), by (kind, name)."""
    done = kustomize(path)
    assert done.returncode == 0, done.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(done.stdout) if d}


@pytest.fixture(scope="module")
def k8s(tmp_path_factory) -> Path:
    """A copy of deploy/k8s with the token file the operator creates (never one in the repository)."""
    copy = tmp_path_factory.mktemp("deploy") / "k8s"
    shutil.copytree(K8S, copy, ignore=shutil.ignore_patterns("token"))
    (copy / "base" / "secrets" / "token").write_text(TOKEN)
    return copy


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request, k8s) -> tuple[str, dict]:
    return request.param, render(k8s / "overlays" / request.param)


def _with_component(k8s: Path, component: str) -> dict:
    """An operator's overlay: the CPU one plus `component`, rendered."""
    mine = k8s.parent / f"with-{component}"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["../k8s/overlays/cpu"], "components": [f"../k8s/components/{component}"]})
    )
    return render(mine)


@pytest.fixture(scope="module")
def tls_overlay(k8s) -> dict:
    """The CPU overlay plus the mutual-TLS component."""
    return _with_component(k8s, "tls")


@pytest.fixture(scope="module")
def tenants_overlay(k8s) -> dict:
    """The CPU overlay plus the tenants component."""
    return _with_component(k8s, "tenants")


@pytest.fixture(scope="module", params=OVERLAYS)
def data_parallel_overlay(request, k8s) -> tuple[str, dict]:
    """An operator's overlay: one of the two plus the data-parallel component (N = 2 as it ships)."""
    mine = k8s.parent / f"dp-{request.param}"
    mine.mkdir()
    component = {"resources": [f"../k8s/overlays/{request.param}"], "components": ["../k8s/components/data-parallel"]}
    (mine / "kustomization.yaml").write_text(yaml.safe_dump(component))
    return request.param, render(mine)


def _container(docs: dict, name: str) -> dict:
    return docs[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]


def _validate(docs: dict) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for (kind, name), doc in docs.items():
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{kind}/{name}: {err}")


def test_every_manifest_validates_against_the_kubernetes_schemas(overlay):
    _validate(overlay[1])


def test_with_the_tls_component_every_manifest_still_validates(tls_overlay):
    _validate(tls_overlay)


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


def test_each_gpu_pod_gets_its_own_gpu_and_a_memory_backed_dev_shm(k8s):
    # A limit per pod: the device plugin hands each pod GPUs no other pod holds (no shared GPU 0, unlike a count
    # in compose); /dev/shm beyond the container default's 64 MiB for NCCL and vLLM's tensor parallelism.
    mine = k8s.parent / "dp-gpu-shm"
    mine.mkdir()
    component = {"resources": ["../k8s/overlays/gpu"], "components": ["../k8s/components/data-parallel"]}
    (mine / "kustomization.yaml").write_text(yaml.safe_dump(component))
    docs = render(mine)
    for kind, pod_name in (("Deployment", "explorer"), ("Deployment", "trainer"), ("StatefulSet", "trainer-rank")):
        pod = docs[(kind, pod_name)]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1", pod_name
        shm = {m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"}
        assert [v["emptyDir"]["medium"] for v in pod["volumes"] if v["name"] in shm] == ["Memory"], pod_name


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
    assert sorted(components["app.kubernetes.io/component"]) == sorted(set(SERVICES) - {"trackers"})  # a gateway client
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]


def test_explorers_scale_by_replicas_behind_a_disruption_budget(overlay):
    _, docs = overlay
    explorer = docs[("Deployment", "explorer")]
    assert explorer["spec"]["replicas"] >= 2
    budget = docs[("PodDisruptionBudget", "explorer")]["spec"]
    assert budget["selector"]["matchLabels"].items() <= explorer["spec"]["template"]["metadata"]["labels"].items()
    instance = next(e for e in _container(docs, "explorer")["env"] if e["name"] == "TRINITY_INSTANCE_ID")
    assert instance["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"  # one id per replica


def test_the_auth_token_comes_from_the_secret_generated_from_the_operators_file(overlay):
    _, docs = overlay
    (secret,) = [doc for (kind, name), doc in docs.items() if kind == "Secret" and name.startswith("trinity-auth-")]
    assert base64.b64decode(secret["data"]["token"]).decode() == TOKEN
    for service in SERVICES:
        token = next(e for e in _container(docs, service)["env"] if e["name"] == "TRINITY_AUTH_TOKEN")
        assert token["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "token"}


def test_followers_ask_the_gateway_for_the_run_secret_with_the_token(overlay):
    _, docs = overlay
    follower = docs[("StatefulSet", "trainer-rank")]["spec"]["template"]["spec"]["containers"][0]
    token = _env(follower)["TRINITY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token["name"].startswith("trinity-auth-") and token["key"] == "token"
    assert {"configMapRef": {"name": _config_map(docs)}} in follower["envFrom"]
    assert docs[("ConfigMap", _config_map(docs))]["data"]["TRINITY_GATEWAY"] == "gateway:50051"


def _config_map(docs: dict) -> str:
    return next(name for kind, name in docs if kind == "ConfigMap" and name.startswith("trinity-env"))


def test_without_a_token_file_the_build_fails_naming_it(tmp_path):
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy, ignore=shutil.ignore_patterns("token"))
    done = kustomize(copy / "overlays" / "cpu")
    assert done.returncode != 0 and "secrets/token" in done.stderr


def test_the_repository_holds_no_token():
    assert [p.name for p in (K8S / "base" / "secrets").iterdir()] in ([".gitignore"], [".gitignore", "token"])
    ignored = subprocess.run(["git", "check-ignore", "-q", str(K8S / "base" / "secrets" / "token")], cwd=ROOT)
    assert ignored.returncode == 0, "deploy/k8s/base/secrets/token must be git-ignored"


def test_the_tls_component_mounts_the_certificate_secret_in_every_service(tls_overlay):
    workloads = [("Deployment", service) for service in SERVICES] + [("StatefulSet", "trainer-rank")]
    for service in workloads:
        pod = tls_overlay[service]["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["tls"]["secret"]["secretName"] == "trinity-tls", service
        mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
        assert mounts["tls"]["mountPath"] == "/etc/trinity/tls" and mounts["tls"]["readOnly"], service


def test_the_tls_component_requires_client_certificates_and_one_server_name(tls_overlay):
    env = tls_overlay[("ConfigMap", "trinity-env")]["data"]
    assert {k: v for k, v in env.items() if k.startswith("TRINITY_TLS_")} == {
        "TRINITY_TLS_CERT": "/etc/trinity/tls/tls.crt",
        "TRINITY_TLS_KEY": "/etc/trinity/tls/tls.key",
        "TRINITY_TLS_CA": "/etc/trinity/tls/ca.crt",
        "TRINITY_TLS_CLIENT_AUTH": "require",
        "TRINITY_TLS_SERVER_NAME": "trinity",
    }


def test_the_tls_component_probes_with_the_health_check_that_speaks_tls(tls_overlay):
    for service in SERVICES:
        container = _container(tls_overlay, service)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert "grpc" not in container[probe], (service, probe)  # native gRPC probes are plaintext only
            assert container[probe]["exec"]["command"] == PROBE, (service, probe)


def test_the_tenants_component_gives_the_gateway_alone_the_tenants_file(tenants_overlay):
    _validate(tenants_overlay)
    pod = tenants_overlay[("Deployment", "gateway")]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tenants"]["configMap"]["name"] == "trinity-tenants"
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["tenants"]["mountPath"] == "/etc/trinity/tenants" and mounts["tenants"]["readOnly"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["TRINITY_TENANTS_FILE"] == "/etc/trinity/tenants/tenants.yaml"  # the key `--from-file` makes
    for service in set(SERVICES) - {"gateway"}:
        names = {e["name"] for e in _container(tenants_overlay, service).get("env", [])}
        assert "TRINITY_TENANTS_FILE" not in names, service


def test_one_trackers_pod_writes_to_the_shared_volume_with_the_operators_tracker_settings(overlay):
    _, docs = overlay
    trackers = docs[("Deployment", "trackers")]
    assert trackers["spec"]["replicas"] == 1 and trackers["spec"]["strategy"]["type"] == "Recreate"  # one writer
    container = _container(docs, "trackers")
    pod = trackers["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert _env(container)["TRINITY_TRACKERS_DIR"]["value"].startswith("/data/")
    assert volumes[mounts["/data"]]["persistentVolumeClaim"]["claimName"] == "trinity-data"
    assert {"secretRef": {"name": "trinity-trackers", "optional": True}} in container["envFrom"]


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


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container["env"]}


def test_without_the_data_parallel_component_the_trainer_is_one_rank(overlay):
    _, docs = overlay
    followers = docs[("StatefulSet", "trainer-rank")]
    assert followers["spec"]["replicas"] == 0
    assert _env(followers["spec"]["template"]["spec"]["containers"][0])["WORLD_SIZE"]["value"] == "1"


def test_with_the_data_parallel_component_every_manifest_still_validates(data_parallel_overlay):
    _validate(data_parallel_overlay[1])


def test_followers_are_ranks_1_to_n_minus_1_of_a_world_of_n(data_parallel_overlay):
    _, docs = data_parallel_overlay
    followers = docs[("StatefulSet", "trainer-rank")]["spec"]
    env = _env(followers["template"]["spec"]["containers"][0])
    world = int(env["WORLD_SIZE"]["value"])
    assert world == 2 and followers["replicas"] == world - 1
    # Pod indexes start at 1 and are the ranks; rank 0 is the trainer service's own pod.
    assert followers["ordinals"] == {"start": 1}
    assert env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert followers["podManagementPolicy"] == "Parallel"
    assert docs[("Deployment", "trainer")]["spec"]["replicas"] == 1


def test_followers_rendezvous_at_rank_0s_stable_name_on_the_headless_service(data_parallel_overlay):
    _, docs = data_parallel_overlay
    followers = docs[("StatefulSet", "trainer-rank")]["spec"]
    env = _env(followers["template"]["spec"]["containers"][0])
    leader = docs[("Deployment", "trainer")]
    pod = leader["spec"]["template"]["spec"]
    # A Deployment pod gets <hostname>.<subdomain> in DNS from a headless Service named <subdomain> that selects it;
    # Recreate keeps one pod at a time on that name.
    assert env["MASTER_ADDR"]["value"] == f"{pod['hostname']}.{pod['subdomain']}" == "trainer-0.trainer-ranks"
    assert leader["spec"]["strategy"]["type"] == "Recreate"
    ranks = docs[("Service", pod["subdomain"])]["spec"]
    assert ranks["clusterIP"] == "None" and ranks["publishNotReadyAddresses"] is True
    assert followers["serviceName"] == pod["subdomain"]
    for labels in (leader["spec"]["template"]["metadata"]["labels"], followers["template"]["metadata"]["labels"]):
        assert ranks["selector"].items() <= labels.items()
    assert [p["port"] for p in ranks["ports"]] == [int(env["MASTER_PORT"]["value"])]
    # ...and the trainer Service reaches rank 0 only, never a follower (which serves no gRPC).
    trainer_selector = docs[("Service", "trainer")]["spec"]["selector"]
    assert not trainer_selector.items() <= followers["template"]["metadata"]["labels"].items()


def test_followers_run_the_rank_entry_point_of_the_trainer_image_with_its_resources(data_parallel_overlay):
    name, docs = data_parallel_overlay
    follower = docs[("StatefulSet", "trainer-rank")]["spec"]["template"]["spec"]
    container, leader = follower["containers"][0], _container(docs, "trainer")
    assert container["command"] == ["trinity-trainer-rank"]
    scripts = tomllib.loads((ROOT / "services" / "trainer" / "pyproject.toml").read_text())["project"].get(
        "scripts", {}
    )
    assert "trinity-trainer-rank" in scripts  # the trainer distribution installs it in the image
    assert container["image"] == leader["image"]
    assert container["resources"] == leader["resources"]
    if name == "gpu":
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert follower["tolerations"] == docs[("Deployment", "trainer")]["spec"]["template"]["spec"]["tolerations"]
    assert follower["securityContext"]["runAsNonRoot"] is True
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"] for v in follower["volumes"] if "persistentVolumeClaim" in v
    }
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert claims[mounts["/data"]] == "trinity-data"  # the model and every rank's checkpoint shards


def test_the_run_settings_the_component_names_are_a_valid_trainer_section(data_parallel_overlay):
    _, docs = data_parallel_overlay
    env = _env(docs[("StatefulSet", "trainer-rank")]["spec"]["template"]["spec"]["containers"][0])
    section = {
        "data_parallel_size": int(env["WORLD_SIZE"]["value"]),
        "local_ranks": 1,
        "master_addr": env["MASTER_ADDR"]["value"],
        "master_port": int(env["MASTER_PORT"]["value"]),
    }
    comment = (K8S / "components" / "data-parallel" / "kustomization.yaml").read_text()
    assert (
        "trainer: {data_parallel_size: N, local_ranks: 1, master_addr: trainer-0.trainer-ranks, master_port: 29500}"
        in comment
    )
    trainer = TorchTrainerConfig.model_validate(section)
    assert (trainer.master_addr, trainer.master_port, trainer.local_ranks) == ("trainer-0.trainer-ranks", 29500, 1)
