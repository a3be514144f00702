"""The ServiceStatus reply every service gives to GetStatus."""

from __future__ import annotations

from importlib.metadata import version

from trinity.v1 import common_pb2


def service_status(
    service: str,
    instance_id: str,
    *,
    state: str = "idle",
    run_id: str = "",
    model_version: int = 0,
    metrics: dict[str, float] | None = None,
) -> common_pb2.ServiceStatus:
    return common_pb2.ServiceStatus(
        service=service,
        instance_id=instance_id,
        version=version("trinity-common"),
        run_id=run_id,
        state=state,
        model_version=model_version,
        metrics=metrics or {},
    )
