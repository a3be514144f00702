"""docker-compose.yml (and the GPU override) as Docker Compose resolves them: accepted by the compose CLI,
valid against the Compose specification's JSON schema, and keeping the promises deploy/README.md makes:
AOF Redis, health-gated start order, ports on loopback, task data for the buffer, the quickstart profile."""

from __future__ import annotations

import json
import subprocess
from importlib import resources

import pytest

from tests.deploy.compose import BASE, GPU, ROOT, TOKEN, compose_command, config, mounts, published, resolved

TRINITY = ("gateway", "buffer", "explorer", "trainer")


@pytest.fixture(scope="module")
def compose_schema() -> dict:
    pytest.importorskip("check_jsonschema", reason="the compose-spec schema ships with check-jsonschema")
    schema_dir = resources.files("check_jsonschema.builtin_schemas.vendor")
    return json.loads(schema_dir.joinpath("compose-spec.json").read_text())


@pytest.mark.parametrize("files", [BASE, GPU], ids=["base", "gpu"])
def test_the_resolved_files_validate_against_the_compose_specification(compose_schema, files):
    import jsonschema

    model = resolved(files)
    errors = sorted(jsonschema.validators.validator_for(compose_schema)(compose_schema).iter_errors(model), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_the_compose_cli_rejects_a_misspelt_key(tmp_path):
    broken = tmp_path / "docker-compose.yml"
    broken.write_text((ROOT / "docker-compose.yml").read_text().replace("    environment:\n", "    enviroment:\n", 1))
    done = subprocess.run([*compose_command(), "-f", str(broken), "config", "--quiet"], capture_output=True, text=True)
    assert done.returncode != 0 and "enviroment" in done.stderr


def test_redis_keeps_an_append_only_file_on_a_named_volume():
    redis = resolved(BASE)["services"]["redis"]
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    assert ("redis-data", "/data") in {(m.source, m.target) for m in mounts(redis)}


def test_gateway_and_buffer_keep_their_state_in_the_shared_redis():
    services = resolved(BASE)["services"]
    for name in ("gateway", "buffer"):
        assert services[name]["environment"]["TRINITY_REDIS_URL"] == "redis://redis:6379/0"
        assert services[name]["depends_on"]["redis"] == {"condition": "service_healthy"}


def test_every_trinity_service_shares_the_data_volume_restarts_and_uses_environment_config():
    services = resolved(BASE)["services"]
    for name in TRINITY:
        assert ("trinity-data", "/data") in {(m.source, m.target) for m in mounts(services[name])}, name
        assert services[name]["healthcheck"]["test"] == ["CMD", "python", "-m", "trinity.runtime.healthcheck"]
        assert services[name]["restart"] == "unless-stopped", name
        assert "command" not in services[name], f"{name} runs the image's `trinity-serve {name}` entrypoint"


def test_the_buffer_reads_task_data_from_the_examples_folder():
    buffer = resolved(BASE)["services"]["buffer"]
    assert (str(ROOT / "examples"), "/examples") in {(m.source, m.target) for m in mounts(buffer)}


def test_ports_are_published_on_loopback_unless_the_user_says_otherwise():
    for env, host in (({}, "127.0.0.1"), ({"TRINITY_PUBLISH_HOST": "0.0.0.0"}, "0.0.0.0")):
        services = resolved(BASE, env)["services"]
        ips = {ip for name in TRINITY for ip, _, _ in published(services[name])}
        assert ips == {host}, env


def test_the_environment_drives_ports_token_and_images():
    env = {"TRINITY_GATEWAY_PORT": "6000", "TRINITY_AUTH_TOKEN": "t", "TRINITY_FLAVOR": "cuda"}
    services = resolved(BASE, env)["services"]
    assert ("127.0.0.1", "6000", 50051) in published(services["gateway"])
    assert services["buffer"]["environment"]["TRINITY_AUTH_TOKEN"] == "t"
    assert services["explorer"]["image"] == "trinity/explorer:0.1.0-cuda"
    assert services["explorer"]["build"]["args"]["FLAVOR"] == "cuda"


def test_compose_refuses_to_run_without_a_token_and_says_how_to_set_one():
    done = config(BASE, {})
    assert done.returncode != 0
    assert "set TRINITY_AUTH_TOKEN" in done.stderr and ".env" in done.stderr


TLS_ENV = {
    "TRINITY_TLS_CERT": "/etc/trinity/tls/service.pem",
    "TRINITY_TLS_KEY": "/etc/trinity/tls/service-key.pem",
    "TRINITY_TLS_CA": "/etc/trinity/tls/ca.pem",
    "TRINITY_TLS_CLIENT_AUTH": "require",
    "TRINITY_TLS_SERVER_NAME": "trinity.internal",
}


def test_given_certificates_every_service_and_the_quickstart_serve_and_dial_tls(tmp_path):
    services = resolved(BASE, {"TRINITY_TLS_DIR": str(tmp_path), **TLS_ENV}, "quickstart")["services"]
    for name in (*TRINITY, "quickstart"):
        environment = services[name]["environment"]
        assert {k: environment[k] for k in TLS_ENV} == TLS_ENV, name
        assert (str(tmp_path), "/etc/trinity/tls") in {(m.source, m.target) for m in mounts(services[name])}, name


def test_without_certificates_every_link_is_plaintext_with_an_empty_tls_volume():
    services = resolved(BASE, {}, "quickstart")["services"]
    for name in (*TRINITY, "quickstart"):
        environment = services[name]["environment"]
        assert [environment[k] for k in ("TRINITY_TLS_CERT", "TRINITY_TLS_CA")] == ["", ""], name
        assert ("trinity-tls", "/etc/trinity/tls") in {(m.source, m.target) for m in mounts(services[name])}, name


def test_the_quickstart_profile_submits_through_the_gateway_and_follows_the_run():
    quickstart = resolved(BASE)["services"]["quickstart"]
    assert quickstart["profiles"] == ["quickstart"]
    assert quickstart["build"]["dockerfile"] == "cli/Dockerfile"  # the `trinity` command's image
    assert quickstart["command"] == [
        "submit", "--gateway", "gateway:50051", "--config", "/examples/quickstart/config.yaml", "--follow",
    ]  # fmt: skip
    assert set(quickstart["depends_on"]) == set(TRINITY)


def test_the_data_parallel_profile_adds_rank_1_joining_the_trainer():
    services = resolved(BASE)["services"]
    rank = services["trainer-rank"]
    assert rank["profiles"] == ["data-parallel"]
    assert rank["image"] == services["trainer"]["image"] and rank["entrypoint"] == ["trinity-trainer-rank"]
    env = rank["environment"]
    assert [env[k] for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")] == ["1", "2", "trainer", "29500"]
    assert ("trinity-data", "/data") in {(m.source, m.target) for m in mounts(rank)}  # model and checkpoint shards
    # It fetches each run's rank secret from the gateway, with the token, over TLS when the services speak it.
    assert env["TRINITY_GATEWAY"] == "gateway:50051" and env["TRINITY_AUTH_TOKEN"] == TOKEN
    assert "/etc/trinity/tls" in {m.target for m in mounts(rank)}


def _gpu_ids(service: dict) -> list[str]:
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert (device["driver"], device["capabilities"], "count" in device) == ("nvidia", ["gpu"], False)
    return device["device_ids"]


def test_the_gpu_override_gives_each_gpu_service_its_own_gpus_and_cuda_images():
    services = resolved(GPU, {}, "data-parallel")["services"]
    # Explicit ids: a `count` would make Docker hand GPU 0 to every service.
    assert {name: _gpu_ids(services[name]) for name in ("trainer", "explorer", "trainer-rank")} == {
        "trainer": ["0"],
        "explorer": ["1"],
        "trainer-rank": ["2"],
    }
    for name in ("explorer", "trainer"):
        assert services[name]["build"]["args"]["FLAVOR"] == "cuda"
        assert services[name]["image"].endswith("-cuda")
        assert services[name]["environment"]["TRINITY_PORT"]  # the override merged, not replaced
    assert services["trainer-rank"]["image"] == services["trainer"]["image"]
    assert "deploy" not in services["gateway"] and "deploy" not in services["buffer"]


def test_the_gpu_services_share_the_hosts_ipc_namespace_and_shared_memory():
    services = resolved(GPU, {}, "data-parallel")["services"]
    # NCCL's shared-memory transport and CUDA IPC between the containers; not compose's 64 MiB /dev/shm.
    assert {name: services[name].get("ipc") for name in ("trainer", "explorer", "trainer-rank", "gateway")} == {
        "trainer": "host",
        "explorer": "host",
        "trainer-rank": "host",
        "gateway": None,
    }


def test_the_gpus_of_each_service_are_set_by_its_variable():
    env = {"TRINITY_TRAINER_GPUS": "0,1", "TRINITY_EXPLORER_GPUS": "2,3", "TRINITY_TRAINER_RANK_GPUS": "4"}
    services = resolved(GPU, env, "data-parallel")["services"]
    assert [_gpu_ids(services[n]) for n in ("trainer", "explorer", "trainer-rank")] == [["0,1"], ["2,3"], ["4"]]
