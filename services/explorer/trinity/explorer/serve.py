"""The serve-mode loop of an ExplorerRunner: run the OpenAI endpoint, load new weights, until stopped.

Weights arrive through the same WeightFeed as in `both` mode and are swapped in under the engine
lock, so one chat call never sees two versions (each experience records the version of its call).
A serve run ends when it is stopped (StopRun, or the run ending elsewhere).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from trinity.config import naming
from trinity.explorer.openai_api import OpenAIServer, ServeBackend, create_app
from trinity.explorer.sessions import SessionStore
from trinity.explorer.weight_feed import WeightFeed
from trinity.v1 import common_pb2

if TYPE_CHECKING:
    from trinity.explorer.runner import ExplorerRunner

WEIGHT_POLL_S = 0.5


def serve_until_stopped(runner: ExplorerRunner) -> None:
    cfg = runner.config
    stream = naming.experience_stream(runner.run_id, runner.stage, cfg.buffer.experience_stream.name)

    def put(experiences: list[common_pb2.Experience]) -> int:
        reply = runner.buffer.put(stream, experiences)
        runner.step += 1
        runner._report(
            "explore",
            step=runner.step,
            metrics={
                "reward_mean": experiences[0].reward if experiences else 0.0,
                "calls": float(len(experiences)),
                "response_tokens": float(sum(len(e.response_token_ids) for e in experiences)),
                "accepted": float(reply.accepted),
            },
        )
        return int(reply.accepted)

    backend = ServeBackend(
        engine=lambda: runner.engine,
        put=put,
        model_name=cfg.model.path,
        run_id=runner.run_id,
        max_tokens=cfg.model.max_response_tokens,
        api_key=os.environ.get("TRINITY_AUTH_TOKEN") or None,
    )
    server = OpenAIServer(
        create_app(backend, SessionStore(ttl_s=cfg.explorer.session_ttl_seconds)),
        host=cfg.explorer.openai_host,
        port=cfg.explorer.openai_port,
    )
    runner.openai_url = server.start()
    runner._report("log", message=f"OpenAI endpoint at {runner.openai_url}", metrics={"openai_port": server.port})
    runner.feed = WeightFeed(runner.gateway, runner.run_id, runner.instance_id)
    runner.feed.start()
    try:
        while not runner._stop.is_set():
            runner._apply_staged_weights(wait_s=WEIGHT_POLL_S)
    finally:
        server.stop()
        runner.openai_url = ""
