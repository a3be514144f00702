"""Process-level settings of a service, from flags and `TRINITY_*` environment variables."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from trinity.runtime.limits import MAX_ACTIVE_RUNS
from trinity.runtime.tenants import TenantsFile, token_sha256
from trinity.runtime.tls import TlsSettings


def _env(name: str, default: str) -> str:
    return os.environ.get(f"TRINITY_{name}", default)


def data_roots_from_env() -> tuple[str, ...]:
    """`TRINITY_DATA_ROOTS` (os.pathsep-separated; default: the working directory), plus `TRINITY_RUNS_DIR` when set.

    The working directory is where a hand-started `trinity serve buffer` finds a project's task files; the runs
    directory is where the services keep runs (checkpoints, exports), so it needs no second mention.
    """
    listed = [root for root in os.environ.get("TRINITY_DATA_ROOTS", "").split(os.pathsep) if root]
    runs = os.environ.get("TRINITY_RUNS_DIR")
    return tuple(dict.fromkeys([*(listed or [os.getcwd()]), *([runs] if runs else [])]))


def auth_token(explicit: str | None = None) -> str | None:
    """The bearer token: `explicit`, else TRINITY_AUTH_TOKEN; surrounding whitespace dropped (a token file
    written by `echo` ends in a newline), empty means none."""
    token = (explicit if explicit is not None else os.environ.get("TRINITY_AUTH_TOKEN", "")).strip()
    return token or None


def _load_tenants(value: object) -> object:
    """A path (TRINITY_TENANTS_FILE) is read here, so that a bad file stops the process at start, naming its field."""
    return TenantsFile.load(value) if isinstance(value, (str, Path)) else value


class ServiceSettings(BaseModel):
    """What every service process needs to start, independent of any run."""

    model_config = ConfigDict(extra="forbid")

    service: str
    host: str = "0.0.0.0"
    port: int = Field(default=0, ge=0, le=65535, description="gRPC port; 0 picks a free one")
    metrics_port: int = Field(default=-1, ge=-1, le=65535, description="-1 disables, 0 picks a free one")
    # Out of repr so that no log line or traceback that shows the settings shows the token.
    auth_token: str | None = Field(default=None, repr=False)
    redis_url: str | None = None
    instance_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    max_message_mb: int = Field(default=256, ge=1, le=2047)
    workers: int = Field(
        default=32,
        ge=1,
        le=1024,
        description="threads for the gRPC handlers' synchronous work at once (more calls queue); health checks, "
        "watches and long polls waiting for data take none (trinity.runtime.server)",
    )
    drain_seconds: float = Field(default=10.0, ge=0)
    gateway: str | None = Field(default=None, description="gateway address to register with")
    advertise_host: str | None = Field(default=None, description="host others reach this service at")
    tls: TlsSettings = Field(default_factory=TlsSettings, description="TLS / mutual TLS (trinity.runtime.tls)")
    liveness_seconds: float = Field(
        default=30.0, gt=0, description="gateway: an instance silent this long is lost (stalls shorter are tolerated)"
    )
    recovery_seconds: float = Field(
        default=300.0, gt=0, description="gateway: a run whose lost service is not back this long after fails"
    )
    data_roots: tuple[str, ...] = Field(
        default_factory=data_roots_from_env,
        description="buffer: every path a client names must resolve inside one of these (TRINITY_DATA_ROOTS)",
    )
    max_active_runs: int = Field(
        default=MAX_ACTIVE_RUNS, ge=1, description="gateway: CreateRun refuses runs beyond this many pending or running"
    )
    trackers_dir: str = Field(
        default="trackers",
        description="trackers: where TensorBoard, MLflow's file store and W&B write (relative: to the working folder)",
    )
    tenants_file: Annotated[TenantsFile | None, BeforeValidator(_load_tenants)] = Field(
        default=None,
        description="gateway: named tokens with quotas, a YAML file (TRINITY_TENANTS_FILE; docs/tenants.md)",
    )

    @model_validator(mode="after")
    def _tenants_need_the_operator_token(self) -> ServiceSettings:
        if self.tenants_file is None or not self.tenants_file.tenants:
            return self
        # Without a service token no interceptor runs: every caller would be let in as the operator.
        if self.auth_token is None:
            raise ValueError("tenants_file: tenants need TRINITY_AUTH_TOKEN, the operator's token, to be set too")
        if token_sha256(self.auth_token) in self.tenants_file.digests():
            raise ValueError("tenants_file: a tenant's token_sha256 is the digest of TRINITY_AUTH_TOKEN")
        return self

    def advertised_address(self, port: int) -> str:
        """host:port as other services should dial it (a wildcard bind advertises the hostname)."""
        host = self.advertise_host or (socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host)
        return f"{host}:{port}"

    @classmethod
    def from_env(cls, service: str, **overrides: object) -> ServiceSettings:
        """Defaults < environment (`TRINITY_PORT`, `TRINITY_AUTH_TOKEN`, ...) < explicit overrides (flags)."""
        values: dict[str, object] = {
            "service": service,
            "host": _env("HOST", "0.0.0.0"),
            "port": int(_env("PORT", "0")),
            "metrics_port": int(_env("METRICS_PORT", "-1")),
            "auth_token": auth_token(),
            "redis_url": os.environ.get("TRINITY_REDIS_URL") or None,
            "max_message_mb": int(_env("MAX_MESSAGE_MB", "256")),
            "workers": int(_env("WORKERS", "32")),
            "drain_seconds": float(_env("DRAIN_SECONDS", "10")),
            "gateway": os.environ.get("TRINITY_GATEWAY") or None,
            "advertise_host": os.environ.get("TRINITY_ADVERTISE_HOST") or None,
            "tls": TlsSettings.from_env(),
            "liveness_seconds": float(_env("LIVENESS_SECONDS", "30")),
            "recovery_seconds": float(_env("RECOVERY_SECONDS", "300")),
            "max_active_runs": int(_env("MAX_ACTIVE_RUNS", str(MAX_ACTIVE_RUNS))),
            "trackers_dir": _env("TRACKERS_DIR", "trackers"),
            # Only the gateway reads it: a variable shared by every container must not need the file everywhere.
            "tenants_file": (os.environ.get("TRINITY_TENANTS_FILE") or None) if service == "gateway" else None,
        }
        if os.environ.get("TRINITY_INSTANCE_ID"):
            values["instance_id"] = os.environ["TRINITY_INSTANCE_ID"]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)
