"""Process-level settings of a service, from flags and `TRINITY_*` environment variables."""

from __future__ import annotations

import os
import socket
import uuid

from pydantic import BaseModel, ConfigDict, Field


def _env(name: str, default: str) -> str:
    return os.environ.get(f"TRINITY_{name}", default)


class ServiceSettings(BaseModel):
    """What every service process needs to start, independent of any run."""

    model_config = ConfigDict(extra="forbid")

    service: str
    host: str = "0.0.0.0"
    port: int = Field(default=0, ge=0, le=65535, description="gRPC port; 0 picks a free one")
    metrics_port: int = Field(default=-1, ge=-1, le=65535, description="-1 disables, 0 picks a free one")
    auth_token: str | None = None
    redis_url: str | None = None
    instance_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    max_message_mb: int = Field(default=256, ge=1, le=2047)
    workers: int = Field(default=32, ge=1, le=1024)
    drain_seconds: float = Field(default=10.0, ge=0)
    gateway: str | None = Field(default=None, description="gateway address to register with")
    advertise_host: str | None = Field(default=None, description="host others reach this service at")

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
            "auth_token": os.environ.get("TRINITY_AUTH_TOKEN") or None,
            "redis_url": os.environ.get("TRINITY_REDIS_URL") or None,
            "max_message_mb": int(_env("MAX_MESSAGE_MB", "256")),
            "workers": int(_env("WORKERS", "32")),
            "drain_seconds": float(_env("DRAIN_SECONDS", "10")),
            "gateway": os.environ.get("TRINITY_GATEWAY") or None,
            "advertise_host": os.environ.get("TRINITY_ADVERTISE_HOST") or None,
        }
        if os.environ.get("TRINITY_INSTANCE_ID"):
            values["instance_id"] = os.environ["TRINITY_INSTANCE_ID"]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)
