"""Mode `serve`: run the OpenAI endpoint, record agent calls, train on the rewarded ones, load new weights.

The run's trainer trains on the experiences rewarded sessions become (the run's algorithm, the
stream's operators); its weights come back through the same weight feed as in `both` mode. A weight
load waits for the calls in flight and holds new ones back meanwhile (the engine's version gate), so
no response is dropped and each one was produced by the single version it reports.

Events: every `REPORT_S` with activity, one `explore` event sums the feedback since the last one
(sessions, calls, mean reward, accepted) and the sessions that expired without feedback, which are
counted and never trained. A serve run ends when its trainer has trained `buffer.total_steps` steps,
or when it is stopped. With `explorer.keep_serving_after_last_step` the endpoint serves on after the
last step, training nothing more (its `/health` says `"training": false`), until the run is stopped
(cancelled); the run then succeeds.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from trinity.explorer.context import ExplorerContext
from trinity.explorer.openai_api import OpenAIServer, ServeBackend, create_app
from trinity.explorer.sessions import SessionStore
from trinity.runtime.tls import TlsSettings
from trinity.v1 import common_pb2, gateway_pb2

WEIGHT_POLL_S = 0.5
REPORT_S = 2.0


@dataclass
class FeedbackTally:
    """Feedback since the last report; filled by the endpoint's threads, emptied by the serve loop."""

    feedbacks: int = 0
    experiences: int = 0
    accepted: int = 0
    reward_sum: float = 0.0
    response_tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, experiences: list[common_pb2.Experience], accepted: int) -> None:
        with self._lock:
            self.feedbacks += 1
            self.experiences += len(experiences)
            self.accepted += accepted
            self.reward_sum += sum(e.reward for e in experiences)
            self.response_tokens += sum(len(e.response_token_ids) for e in experiences)

    def take(self) -> dict[str, float]:
        with self._lock:
            metrics = {
                "feedbacks": float(self.feedbacks),
                "experiences": float(self.experiences),
                "accepted": float(self.accepted),
                "reward_mean": self.reward_sum / self.experiences if self.experiences else 0.0,
                "response_tokens": float(self.response_tokens),
            }
            self.feedbacks = self.experiences = self.accepted = self.response_tokens = 0
            self.reward_sum = 0.0
            return metrics


def run(ctx: ExplorerContext) -> str:
    """Serve until the run stops; returns the finish message."""
    cfg = ctx.config
    stream = ctx.experience_stream()
    tally = FeedbackTally()

    def put(experiences: list[common_pb2.Experience]) -> int:
        accepted = int(ctx.buffer.put(stream, experiences).accepted)
        tally.add(experiences, accepted)
        return accepted

    backend = ServeBackend(
        engine=lambda: ctx.engine,
        put=put,
        model_name=cfg.explorer.served_model_name or cfg.name,
        run_id=ctx.run_id,
        training=lambda: not ctx.training_finished,
        max_tokens=cfg.model.max_response_tokens,
        api_key=os.environ.get("TRINITY_AUTH_TOKEN") or None,
    )
    sessions = SessionStore(ttl_s=cfg.explorer.session_ttl_seconds)
    server = OpenAIServer(
        create_app(backend, sessions),
        host=cfg.explorer.openai_host,
        port=cfg.explorer.openai_port,
        tls=TlsSettings.from_env(),
    )
    ctx.openai_url = server.start()
    ctx.report(
        gateway_pb2.EVENT_KIND_LOG, message=f"OpenAI endpoint at {ctx.openai_url}", metrics={"openai_port": server.port}
    )
    ctx.start_weight_feed()
    last_report = time.monotonic()
    announced = False
    try:
        while not ctx.stopped:
            if ctx.training_finished and not announced:
                announced = True
                ctx.report(
                    gateway_pb2.EVENT_KIND_LOG,
                    message=f"training finished; the OpenAI endpoint at {ctx.openai_url} serves on, untrained, "
                    "until the run is stopped",
                    metrics={"openai_port": server.port},
                )
            ctx.apply_staged_weights(wait_s=WEIGHT_POLL_S)
            expired = sessions.expire()
            if expired.sessions:
                ctx.report(
                    gateway_pb2.EVENT_KIND_LOG,
                    message=f"{expired.sessions} sessions ({expired.calls} calls) expired without feedback",
                    metrics={"expired_sessions": float(expired.sessions), "expired_calls": float(expired.calls)},
                )
            if time.monotonic() - last_report >= REPORT_S:
                last_report = time.monotonic()
                _report_feedback(ctx, tally, sessions)
    finally:
        server.stop()
        ctx.openai_url = ""
        _report_feedback(ctx, tally, sessions)
    return "explorer finished"


def _report_feedback(ctx: ExplorerContext, tally: FeedbackTally, sessions: SessionStore) -> None:
    metrics = tally.take()
    if not metrics["feedbacks"]:
        return
    stats = sessions.stats()
    ctx.step += 1
    ctx.report(
        gateway_pb2.EVENT_KIND_EXPLORE,
        metrics={
            **metrics,
            "open_sessions": float(stats.open_sessions),
            "expired_sessions_total": float(stats.expired_sessions),
            "calls_in_flight": float(ctx.engine.calls_in_flight),
        },
    )
