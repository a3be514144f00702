"""Mode `serve`: run the OpenAI endpoint, record agent calls, load new weights, until stopped.

Weights arrive through the same weight feed as in `both` mode and are swapped in under the engine
lock, so one chat call never sees two versions (each experience records the version of its call).
A serve run ends when it is stopped (StopRun, or the run ending elsewhere).
"""

from __future__ import annotations

import os

from trinity.explorer.context import ExplorerContext
from trinity.explorer.openai_api import OpenAIServer, ServeBackend, create_app
from trinity.explorer.sessions import SessionStore
from trinity.runtime.tls import TlsSettings
from trinity.v1 import common_pb2

WEIGHT_POLL_S = 0.5


def run(ctx: ExplorerContext) -> str:
    """Serve until the run stops; returns the finish message."""
    cfg = ctx.config
    stream = ctx.experience_stream()

    def put(experiences: list[common_pb2.Experience]) -> int:
        reply = ctx.buffer.put(stream, experiences)
        ctx.step += 1
        ctx.report(
            "explore",
            metrics={
                "reward_mean": experiences[0].reward if experiences else 0.0,
                "calls": float(len(experiences)),
                "response_tokens": float(sum(len(e.response_token_ids) for e in experiences)),
                "accepted": float(reply.accepted),
            },
        )
        return int(reply.accepted)

    backend = ServeBackend(
        engine=lambda: ctx.engine,
        put=put,
        model_name=cfg.model.path,
        run_id=ctx.run_id,
        max_tokens=cfg.model.max_response_tokens,
        api_key=os.environ.get("TRINITY_AUTH_TOKEN") or None,
    )
    server = OpenAIServer(
        create_app(backend, SessionStore(ttl_s=cfg.explorer.session_ttl_seconds)),
        host=cfg.explorer.openai_host,
        port=cfg.explorer.openai_port,
        tls=TlsSettings.from_env(),
    )
    ctx.openai_url = server.start()
    ctx.report("log", message=f"OpenAI endpoint at {ctx.openai_url}", metrics={"openai_port": server.port})
    ctx.start_weight_feed()
    try:
        while not ctx.stopped:
            ctx.apply_staged_weights(wait_s=WEIGHT_POLL_S)
    finally:
        server.stop()
        ctx.openai_url = ""
    return "explorer finished"
