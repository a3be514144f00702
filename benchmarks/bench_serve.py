"""Serve mode under load: 32 agent sessions at once against the same 32 served one at a time.

The whole serving path runs: the `openai` package's client over HTTP -> the explorer's OpenAI
endpoint -> the vLLM engine's continuous-batching loop -> recorded calls -> feedback. Each session is
a two-turn chat (the second call re-sends the first answer), then one feedback post. The Buffer is
left out (`put` counts): this measures serving, not storage.

The sequential pass is the baseline, measured in the same process on the same engine; passes
alternate and the best of each is kept, so machine noise hits both alike. tokens/s = completion
tokens of all calls / wall seconds; latency = one chat call, client side.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.common import percentile, write_result

SESSIONS = 32
MAX_TOKENS = 48
QUESTION = "What is {a}+{b}? Answer with just the number."


def _session(client: Any, http: Any, index: int) -> tuple[int, list[float]]:
    """One agent episode; returns its completion tokens and each call's latency."""
    session = {"X-Session-Id": f"bench-{index}-{time.monotonic_ns()}"}
    messages: list[dict[str, str]] = [{"role": "user", "content": QUESTION.format(a=index % 9 + 1, b=index % 7 + 1)}]
    tokens, latencies = 0, []
    for follow_up in ("Are you sure? Explain briefly.", None):
        started = time.perf_counter()
        reply = client.chat.completions.create(
            model="m", messages=messages, max_tokens=MAX_TOKENS, temperature=1.0, extra_headers=session
        )
        latencies.append(time.perf_counter() - started)
        tokens += reply.usage.completion_tokens
        if follow_up is not None:
            messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""}]
            messages += [{"role": "user", "content": follow_up}]
    http.post("/feedback", json={"session_id": session["X-Session-Id"], "reward": 1.0}).raise_for_status()
    return tokens, latencies


def _pass(base_url: str, concurrency: int) -> dict[str, float]:
    import httpx
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    http = httpx.Client(base_url=base_url.removesuffix("/v1"), timeout=600)
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(lambda i: _session(client, http, i), range(SESSIONS)))
    wall = time.perf_counter() - started
    http.close()
    latencies = [lat for _, lats in done for lat in lats]
    tokens = sum(t for t, _ in done)
    return {
        "wall_s": round(wall, 2),
        "completion_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 1),
        "latency_p50_s": round(percentile(latencies, 50), 3),
        "latency_p99_s": round(percentile(latencies, 99), 3),
    }


def run(quick: bool = False) -> dict[str, Any]:
    from trinity.explorer.engines import create_engine
    from trinity.explorer.openai_api import OpenAIServer, ServeBackend, create_app
    from trinity.explorer.sessions import SessionStore
    from trinity.models import resolve_model_path

    model = resolve_model_path("smollm2")
    engine = create_engine("vllm", model_path=model, dtype="bfloat16", seed=0, max_model_len=512)
    backend = ServeBackend(engine=lambda: engine, put=len, model_name=Path(model).name, max_tokens=MAX_TOKENS)
    server = OpenAIServer(create_app(backend, SessionStore()))
    url = server.start()
    try:
        _pass(url, SESSIONS)  # warm-up: the first sampling call compiles kernels
        rounds = 1 if quick else 2
        best: dict[str, dict[str, float]] = {}
        for _ in range(rounds):
            for name, concurrency in (("one_at_a_time", 1), ("concurrent_32", SESSIONS)):
                result = _pass(url, concurrency)
                if name not in best or result["tokens_per_s"] > best[name]["tokens_per_s"]:
                    best[name] = result
    finally:
        server.stop()
        engine.close()
    ratio = best["concurrent_32"]["tokens_per_s"] / best["one_at_a_time"]["tokens_per_s"]
    result = {
        "model": "SmolLM2-135M-Instruct bf16, vLLM CPU in-process",
        "sessions": SESSIONS,
        "calls_per_session": 2,
        "max_tokens": MAX_TOKENS,
        **best,
        "tokens_per_s_ratio": round(ratio, 2),
    }
    write_result("serve", result)
    return result


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
