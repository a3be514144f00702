"""TLS and mutual TLS for every gRPC link, from PEM files named by settings or `TRINITY_TLS_*` variables.

One set of variables serves a process in both of its roles, since every service is a server and a client:
- `TRINITY_TLS_CERT` + `TRINITY_TLS_KEY`: the process's certificate chain and key. A server with them accepts TLS
  only; a client presents them to servers that ask (mutual TLS).
- `TRINITY_TLS_CA`: the CA bundle that signed the peers' certificates. A client dials TLS whenever a CA or a
  certificate is configured, verifying the server against the CA (the system roots when none is given).
- `TRINITY_TLS_CLIENT_AUTH=require`: the server also demands a client certificate signed by `TRINITY_TLS_CA`.
  Not implied by the CA alone, because every client needs the CA too, and the SDK or CLI may hold no certificate.
- `TRINITY_TLS_SERVER_NAME`: the name clients check in the server's certificate instead of the host they dial.
  Services reach each other at registered addresses (pod IPs, container hostnames) no certificate can list, so a
  deployment issues certificates for one name and sets it here.
Without any of them every link is plaintext, as on the loopback of `trinity run`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import grpc
from pydantic import BaseModel, ConfigDict, model_validator

from trinity.runtime.logging import get_logger

log = get_logger(__name__)

ENV = {
    "cert": "TRINITY_TLS_CERT",
    "key": "TRINITY_TLS_KEY",
    "ca": "TRINITY_TLS_CA",
    "client_auth": "TRINITY_TLS_CLIENT_AUTH",
    "server_name": "TRINITY_TLS_SERVER_NAME",
}


class TlsSettings(BaseModel):
    """Where a process's TLS material lives; the files are read when a port is bound or a channel opened."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    client_auth: Literal["none", "require"] = "none"
    server_name: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> TlsSettings:
        if (self.cert is None) != (self.key is None):
            raise ValueError("a TLS certificate needs its key: set TRINITY_TLS_CERT and TRINITY_TLS_KEY, or neither")
        if self.client_auth == "require" and (self.ca is None or self.cert is None):
            raise ValueError(
                "TRINITY_TLS_CLIENT_AUTH=require needs the server's TRINITY_TLS_CERT/TRINITY_TLS_KEY and the "
                "TRINITY_TLS_CA that signed the client certificates"
            )
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, **overrides: str | Path | None) -> TlsSettings:
        """`TRINITY_TLS_*` variables of `environ`, with the `overrides` that are not None winning."""
        values: dict[str, object] = {field: environ[name] for field, name in ENV.items() if environ.get(name)}
        values.update({field: value for field, value in overrides.items() if value is not None})
        return cls.model_validate(values)

    @property
    def serves_tls(self) -> bool:
        return self.cert is not None

    @property
    def dials_tls(self) -> bool:
        return self.ca is not None or self.cert is not None

    def server_credentials(self) -> grpc.ServerCredentials:
        if self.cert is None or self.key is None:
            raise ValueError("serving TLS needs TRINITY_TLS_CERT and TRINITY_TLS_KEY")
        require = self.client_auth == "require"
        return grpc.ssl_server_credentials(
            [(_read(self.key, "key"), _read(self.cert, "cert"))],
            root_certificates=_read(self.ca, "ca") if require and self.ca is not None else None,
            require_client_auth=require,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "ca") if self.ca is not None else None,
            private_key=_read(self.key, "key") if self.key is not None else None,
            certificate_chain=_read(self.cert, "cert") if self.cert is not None else None,
        )

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []

    def bind(self, server: grpc.Server | grpc.aio.Server, address: str) -> int:
        """Bind `address` (host:port) on `server`, TLS when a certificate is configured; returns the bound port."""
        if not self.serves_tls:
            return server.add_insecure_port(address)
        port = server.add_secure_port(address, self.server_credentials())
        log.info("tls.serving", address=address, client_auth=self.client_auth)
        return port


def _read(path: Path, field: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise FileNotFoundError(
            f"cannot read {ENV[field]}={path} ({err.strerror}); point it at a readable PEM file or unset it"
        ) from None
