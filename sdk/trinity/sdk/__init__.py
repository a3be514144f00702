"""The Trinity Python SDK: create runs, watch them, read their metrics, cancel them.

    from trinity.sdk import TrinityClient

    client = TrinityClient("127.0.0.1:50051")
    run = client.create_run("examples/quickstart/config.yaml")
    for event in run.watch():
        print(kind_name(event.kind), dict(event.metrics))  # from trinity.runtime.events: "train", "eval", ...
    run.steer(temperature=0.7)   # a live run's knobs: pause_exploration, temperature, learning_rate
    print(run.wait().state)

`AsyncTrinityClient` offers the same with `async`/`await`.
"""

from trinity.sdk.client import AsyncRunHandle, AsyncTrinityClient, RunHandle, TrinityClient
from trinity.sdk.errors import (
    GatewayUnavailable,
    InvalidRequest,
    InvalidRunConfig,
    RunConflict,
    RunNotFound,
    TrinityError,
)
from trinity.sdk.metrics import RunMetrics

__all__ = [
    "AsyncRunHandle",
    "AsyncTrinityClient",
    "GatewayUnavailable",
    "InvalidRequest",
    "InvalidRunConfig",
    "RunConflict",
    "RunHandle",
    "RunMetrics",
    "RunNotFound",
    "TrinityClient",
    "TrinityError",
]
