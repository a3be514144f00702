"""The Trinity Python SDK: create runs, watch them, read their metrics, cancel them.

    from trinity.sdk import TrinityClient

    client = TrinityClient("127.0.0.1:50051")
    run = client.create_run("examples/quickstart/config.yaml")
    for event in run.watch():
        print(kind_name(event.kind), dict(event.metrics))  # from trinity.runtime.events: "train", "eval", ...
    run.steer(temperature=0.7)   # a live run's knobs: pause_exploration, temperature, learning_rate
    print(run.wait().state)
    for span in run.spans(since_step=1):  # the timeline: phase, source, step, start/end unix ms
        print(phase_name(span.phase), span.source, span.step, span.end_unix_ms - span.start_unix_ms)

`phase_name` (from trinity.runtime.spans) names a phase: "rollout", "forward_backward", ...
`AsyncTrinityClient` offers the same with `async`/`await`.
"""

from trinity.sdk.client import AsyncRunHandle, AsyncTrinityClient, RunHandle, TrinityClient
from trinity.sdk.errors import (
    GatewayUnavailable,
    InvalidRequest,
    InvalidRunConfig,
    NotPermitted,
    QuotaExceeded,
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
    "NotPermitted",
    "QuotaExceeded",
    "RunConflict",
    "RunHandle",
    "RunMetrics",
    "RunNotFound",
    "TrinityClient",
    "TrinityError",
]
