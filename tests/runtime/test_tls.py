"""TLS and mutual TLS on real service processes, with certificates the tests issue; the bearer token on top of
them; the container probe, the CLI and the SDK over TLS; and no token in any log."""

from __future__ import annotations

import asyncio
import os
import secrets
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pydantic
import pytest

from tests.conftest import ServiceProcess
from tests.deploy.pki import Pki, issue_pki
from trinity.clients import BufferClient
from trinity.config import StreamConfig
from trinity.runtime.client import open_channel
from trinity.runtime.logging import REDACTED, RedactSecrets
from trinity.runtime.settings import ServiceSettings
from trinity.runtime.tls import TlsSettings
from trinity.sdk import AsyncTrinityClient, TrinityClient
from trinity.v1 import common_pb2, gateway_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
TOKEN = secrets.token_hex(16)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return issue_pki(tmp_path_factory.mktemp("pki"))


def _service_env(pki: Pki, redis_url: str, *, client_auth: str) -> dict[str, str]:
    return {
        "TRINITY_REDIS_URL": redis_url,
        "TRINITY_AUTH_TOKEN": TOKEN,
        "TRINITY_TLS_CERT": str(pki.server.cert),
        "TRINITY_TLS_KEY": str(pki.server.key),
        "TRINITY_TLS_CA": str(pki.ca),
        "TRINITY_TLS_CLIENT_AUTH": client_auth,
    }


def _without_trinity_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}


@pytest.fixture(scope="module")
def tls_gateway(pki, redis_server) -> Iterator[ServiceProcess]:
    """A gateway serving TLS, any client welcome (server authentication only)."""
    service = ServiceProcess("gateway", env=_service_env(pki, redis_server.url, client_auth="none")).start()
    yield service
    service.stop()


@pytest.fixture(scope="module")
def mtls_gateway(pki, redis_server) -> Iterator[ServiceProcess]:
    """A gateway serving mutual TLS: only clients with a certificate from the CA get in."""
    service = ServiceProcess("gateway", env=_service_env(pki, redis_server.url, client_auth="require")).start()
    yield service
    service.stop()


def _get_status(address: str, *, tls: TlsSettings, token: str = TOKEN) -> grpc.StatusCode:
    """The status of one GetStatus call (no client-side retries beyond gRPC's own, bounded by the deadline)."""
    with open_channel(address, token=token, tls=tls) as channel:
        try:
            gateway_pb2_grpc.GatewayServiceStub(channel).GetStatus(common_pb2.GetStatusRequest(), timeout=15)
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


# ---- settings ------------------------------------------------------------------------------------------------


def test_a_certificate_without_its_key_is_refused_naming_both_variables(pki):
    with pytest.raises(pydantic.ValidationError, match="TRINITY_TLS_CERT and TRINITY_TLS_KEY"):
        TlsSettings.from_env({"TRINITY_TLS_CERT": str(pki.server.cert)})


def test_requiring_client_certificates_without_a_ca_is_refused(pki):
    env = {"TRINITY_TLS_CERT": str(pki.server.cert), "TRINITY_TLS_KEY": str(pki.server.key)}
    with pytest.raises(pydantic.ValidationError, match="TRINITY_TLS_CA"):
        TlsSettings.from_env({**env, "TRINITY_TLS_CLIENT_AUTH": "require"})


def test_an_unreadable_tls_file_names_its_variable(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"TRINITY_TLS_CA=.*missing\.pem"):
        TlsSettings(ca=tmp_path / "missing.pem").channel_credentials()


def test_explicit_tls_files_override_the_environment(pki):
    tls = TlsSettings.from_env({"TRINITY_TLS_CA": str(pki.other_ca)}, ca=pki.ca)
    assert tls.ca == pki.ca


def test_the_settings_repr_leaves_the_token_out():
    settings = ServiceSettings(service="gateway", auth_token=TOKEN)
    assert TOKEN not in repr(settings) and TOKEN not in str(settings)


# ---- TLS: the server proves who it is ------------------------------------------------------------------------


def test_a_client_that_trusts_the_ca_is_served_over_tls(pki, tls_gateway):
    assert _get_status(tls_gateway.address, tls=TlsSettings(ca=pki.ca)) == grpc.StatusCode.OK


def test_a_plaintext_client_cannot_talk_to_a_tls_server(tls_gateway):
    assert _get_status(tls_gateway.address, tls=TlsSettings()) == grpc.StatusCode.UNAVAILABLE


def test_a_client_refuses_a_server_whose_certificate_another_ca_signed(pki, tls_gateway):
    assert _get_status(tls_gateway.address, tls=TlsSettings(ca=pki.other_ca)) == grpc.StatusCode.UNAVAILABLE


def test_the_token_is_still_required_over_tls(pki, tls_gateway):
    tls = TlsSettings(ca=pki.ca)
    assert _get_status(tls_gateway.address, tls=tls, token="") == grpc.StatusCode.UNAUTHENTICATED
    assert _get_status(tls_gateway.address, tls=tls, token="wrong") == grpc.StatusCode.UNAUTHENTICATED


# ---- mutual TLS: the client proves who it is too ------------------------------------------------------------


def test_mutual_tls_refuses_a_client_without_a_certificate(pki, mtls_gateway):
    assert _get_status(mtls_gateway.address, tls=TlsSettings(ca=pki.ca)) == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_refuses_a_client_certificate_from_another_ca(pki, mtls_gateway):
    tls = TlsSettings(ca=pki.ca, cert=pki.stranger.cert, key=pki.stranger.key)
    assert _get_status(mtls_gateway.address, tls=tls) == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_serves_a_client_with_a_certificate_from_the_ca(pki, mtls_gateway):
    tls = TlsSettings(ca=pki.ca, cert=pki.client.cert, key=pki.client.key)
    assert _get_status(mtls_gateway.address, tls=tls) == grpc.StatusCode.OK


def test_the_container_health_probe_passes_against_a_mutual_tls_service(pki, mtls_gateway):
    # What Docker's HEALTHCHECK and the Kubernetes exec probe run, with the service's own environment.
    env = _without_trinity_env() | _service_env(pki, "unused", client_auth="require")
    done = subprocess.run(
        [sys.executable, "-m", "trinity.runtime.healthcheck"],
        env=env | {"TRINITY_PORT": str(mtls_gateway.port)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


# ---- the CLI and the SDK ------------------------------------------------------------------------------------


def test_trinity_submit_reaches_a_mutual_tls_gateway(pki, mtls_gateway, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trinity.cli",
            "submit",
            "--gateway",
            mtls_gateway.address,
            "--config",
            str(ROOT / "examples" / "quickstart" / "config.yaml"),
            "--tls-ca",
            str(pki.ca),
            "--tls-cert",
            str(pki.client.cert),
            "--tls-key",
            str(pki.client.key),
            "--token-file",
            str(token_file),
        ],
        env=_without_trinity_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.split()[1]
    tls = {"tls_ca": pki.ca, "tls_cert": pki.client.cert, "tls_key": pki.client.key}
    with TrinityClient(mtls_gateway.address, token=TOKEN, **tls) as client:
        client.run(run_id).cancel("test over")


def test_the_async_sdk_client_reaches_a_mutual_tls_gateway(pki, mtls_gateway):
    async def list_runs() -> int:
        tls = {"tls_ca": pki.ca, "tls_cert": pki.client.cert, "tls_key": pki.client.key}
        async with AsyncTrinityClient(mtls_gateway.address, token=TOKEN, **tls) as client:
            return len(await client.list_runs())

    assert asyncio.run(list_runs()) >= 0


def test_the_explorers_openai_endpoint_serves_https_with_the_services_certificate(pki):
    from trinity.explorer.openai_api import OpenAIServer, ServeBackend, create_app

    backend = ServeBackend(engine=lambda: None, put=lambda experiences: 0, model_name="tiny")
    tls = TlsSettings(cert=pki.server.cert, key=pki.server.key, ca=pki.ca)
    server = OpenAIServer(create_app(backend), tls=tls)
    url = server.start()
    try:
        trust = ssl.create_default_context(cafile=pki.ca)
        reply = httpx.get(url.removesuffix("/v1") + "/health", verify=trust, timeout=30)
    finally:
        server.stop()
    assert url.startswith("https://") and reply.status_code == 200


# ---- no token in any log ------------------------------------------------------------------------------------


def test_log_events_mask_the_token_wherever_it_appears_and_fields_named_like_credentials():
    redact = RedactSecrets([TOKEN])
    event = redact(None, "error", {"event": f"call with {TOKEN}", "exception": f"Traceback: {TOKEN}!", "api_key": "k"})
    assert event == {"event": f"call with {REDACTED}", "exception": f"Traceback: {REDACTED}!", "api_key": REDACTED}


def test_no_log_shows_the_token(pki, redis_server, unique, tmp_path):
    """Gateway and buffer with mutual TLS and a token, logging at debug: the buffer registers and heartbeats,
    calls succeed, fail for a wrong token, fail for a missing stream; nothing they log contains the token."""
    env = _service_env(pki, redis_server.url, client_auth="require") | {"TRINITY_LOG_LEVEL": "debug"}
    gateway = ServiceProcess("gateway", env=env).start()
    buffer = ServiceProcess("buffer", env=env | {"TRINITY_GATEWAY": gateway.address}).start()
    tls = TlsSettings(ca=pki.ca, cert=pki.client.cert, key=pki.client.key)
    try:
        with BufferClient(buffer.address, token=TOKEN, tls=tls) as client:
            client.create_stream(StreamConfig(name=unique))
            with pytest.raises(grpc.RpcError):
                client.stream(unique + "-missing")
        assert _get_status(buffer.address, tls=tls, token=TOKEN + "x") == grpc.StatusCode.UNAUTHENTICATED
        assert _get_status(gateway.address, tls=tls, token="wrong") == grpc.StatusCode.UNAUTHENTICATED
        cli = subprocess.run(
            [sys.executable, "-m", "trinity.cli", "runs", "list", "--gateway", gateway.address],
            env=_without_trinity_env() | {"TRINITY_AUTH_TOKEN": TOKEN, "TRINITY_TLS_CA": str(pki.ca)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode != 0  # no client certificate: refused
    finally:
        buffer.stop()
        gateway.stop()
    logs = {"gateway": gateway.logs(), "buffer": buffer.logs(), "cli": cli.stdout + cli.stderr}
    assert '"service.serving"' in logs["buffer"]  # the logs were written, at debug level
    assert [name for name, text in logs.items() if TOKEN in text] == []
