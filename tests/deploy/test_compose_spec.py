"""docker-compose.yml (and the GPU override) validate against the Compose specification's JSON schema,
and keep the promises deploy/README.md makes: AOF Redis, health-gated start order, the quickstart profile."""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest
import yaml

from trinity.cli.stack.compose import interpolate, load_compose, merge, read_yaml

ROOT = Path(__file__).resolve().parents[2]
FILES = {"base": [ROOT / "docker-compose.yml"], "gpu": [ROOT / "docker-compose.yml", ROOT / "docker-compose.gpu.yml"]}


@pytest.fixture(scope="module")
def compose_schema() -> dict:
    pytest.importorskip("check_jsonschema", reason="the compose-spec schema ships with check-jsonschema")
    schema_dir = resources.files("check_jsonschema.builtin_schemas.vendor")
    return json.loads(schema_dir.joinpath("compose-spec.json").read_text())


@pytest.mark.parametrize("variant", sorted(FILES))
def test_the_compose_files_validate_against_the_compose_specification(compose_schema, variant):
    import jsonschema

    model: dict = {}
    for path in FILES[variant]:
        model = merge(model, interpolate(yaml.safe_load(path.read_text()), {}))
    errors = sorted(jsonschema.validators.validator_for(compose_schema)(compose_schema).iter_errors(model), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_the_schema_check_rejects_a_misspelt_key(compose_schema):
    import jsonschema

    model = interpolate(read_yaml(ROOT / "docker-compose.yml"), {})
    model["services"]["buffer"]["enviroment"] = {"TRINITY_PORT": "1"}
    assert list(jsonschema.validators.validator_for(compose_schema)(compose_schema).iter_errors(model))


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is not installed here")
def test_docker_compose_config_accepts_the_files():
    args = ["docker-compose", *[a for p in FILES["gpu"] for a in ("-f", str(p))], "config", "--quiet"]
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_redis_keeps_an_append_only_file_on_a_named_volume():
    redis = load_compose(FILES["base"], {})["services"]["redis"]
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    assert "redis-data:/data" in redis["volumes"]


def test_gateway_and_buffer_keep_their_state_in_the_shared_redis():
    services = load_compose(FILES["base"], {})["services"]
    for name in ("gateway", "buffer"):
        assert services[name]["environment"]["TRINITY_REDIS_URL"] == "redis://redis:6379/0"
        assert services[name]["depends_on"]["redis"] == {"condition": "service_healthy"}


def test_every_trinity_service_shares_the_data_volume_and_uses_environment_config():
    services = load_compose(FILES["base"], {})["services"]
    for name in ("gateway", "buffer", "explorer", "trainer"):
        assert "trinity-data:/data" in services[name]["volumes"], name
        assert services[name]["healthcheck"]["test"] == ["CMD", "python", "-m", "trinity.runtime.healthcheck"]
        assert "command" not in services[name], f"{name} runs the image's `trinity serve {name}` entrypoint"


def test_the_environment_drives_ports_token_and_images():
    env = {"TRINITY_GATEWAY_PORT": "6000", "TRINITY_AUTH_TOKEN": "t", "TRINITY_FLAVOR": "cuda"}
    services = load_compose(FILES["base"], env)["services"]
    assert "6000:50051" in services["gateway"]["ports"]
    assert services["buffer"]["environment"]["TRINITY_AUTH_TOKEN"] == "t"
    assert services["explorer"]["image"] == "trinity/explorer:0.1.0-cuda"
    assert services["explorer"]["build"]["args"]["FLAVOR"] == "cuda"


def test_the_quickstart_profile_submits_through_the_gateway():
    quickstart = load_compose(FILES["base"], {})["services"]["quickstart"]
    assert quickstart["profiles"] == ["quickstart"]
    assert quickstart["entrypoint"] == ["trinity"]
    assert quickstart["command"] == [
        "submit", "--gateway", "gateway:50051", "--config", "/examples/quickstart/config.yaml",
    ]  # fmt: skip
    assert set(quickstart["depends_on"]) == {"gateway", "buffer", "explorer", "trainer"}


def test_the_gpu_override_reserves_gpus_and_switches_to_cuda_images():
    services = load_compose(FILES["gpu"], {})["services"]
    for name in ("explorer", "trainer"):
        (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert (device["driver"], device["count"], device["capabilities"]) == ("nvidia", "1", ["gpu"])
        assert services[name]["build"]["args"]["FLAVOR"] == "cuda"
        assert services[name]["image"].endswith("-cuda")
        assert services[name]["environment"]["TRINITY_PORT"]  # the override merged, not replaced
    assert "deploy" not in services["gateway"] and "deploy" not in services["buffer"]
