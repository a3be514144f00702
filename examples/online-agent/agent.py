"""An agent trained online through Trinity's serve mode: single-digit addition, many sessions at once.

It is an ordinary `openai`-package agent. The Trinity-specific lines: the client's `base_url` (the
explorer's endpoint) and `api_key` (the run's TRINITY_AUTH_TOKEN, if any), an `X-Session-Id` header
per episode, and one POST to `/feedback` with the episode's reward when it ends.

    python examples/online-agent/agent.py --url http://127.0.0.1:8000/v1 --sessions 64 --concurrency 16

Sessions come in groups of `--repeats` that ask the same question and share a `group_id`: GRPO
compares them with each other. With `--turns 2` a wrong first answer gets one retry (half reward).
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import httpx
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

QUESTION = "What is {a}+{b}? Answer with just the number."
RETRY = "That is not right. What is {a}+{b}? Answer with just the number."


class Question(NamedTuple):
    a: int
    b: int
    group_id: str  # the sessions that ask it share it


def reward(text: str, expected: int) -> float:
    """1 if the last integer in the answer is the sum, else 0."""
    numbers = re.findall(r"-?\d+", text)
    return 1.0 if numbers and int(numbers[-1]) == expected else 0.0


def ask(
    client: OpenAI,
    session_id: str,
    messages: list[ChatCompletionMessageParam],
    temperature: float,
    stream: bool,
    max_tokens: int = 16,
) -> str:
    """One chat call in the session (streamed or not); returns the reply's text."""
    headers = {"X-Session-Id": session_id}  # Trinity: which episode this call belongs to
    if not stream:
        reply = client.chat.completions.create(
            model="policy", messages=messages, temperature=temperature, max_tokens=max_tokens, extra_headers=headers
        )
        return reply.choices[0].message.content or ""
    chunks = client.chat.completions.create(
        model="policy",
        messages=messages,
        temperature=temperature,
        max_tokens=max_tokens,
        extra_headers=headers,
        stream=True,
    )
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def run_session(
    client: OpenAI, feedback_url: str, question: Question, *, turns: int, temperature: float, stream: bool
) -> float:
    """One episode: ask, retry once per extra turn after a wrong answer, post the reward; returns it."""
    session_id = uuid.uuid4().hex
    a, b = question.a, question.b
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION.format(a=a, b=b)}]
    score = 0.0
    for turn in range(turns):
        text = ask(client, session_id, messages, temperature, stream)
        if reward(text, a + b):
            score = 1.0 / (turn + 1)
            break
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": RETRY.format(a=a, b=b)}]
    # Trinity: the episode's reward; every call of the session is trained with it, in the question's group.
    feedback = {"session_id": session_id, "reward": score, "group_id": question.group_id}
    auth = {"Authorization": f"Bearer {client.api_key}"}
    httpx.post(feedback_url, json=feedback, headers=auth, timeout=60).raise_for_status()
    return score


def questions(sessions: int, repeats: int, rng: random.Random) -> list[Question]:
    """`sessions` questions, each one asked by `repeats` sessions in a row (one GRPO group)."""
    out: list[Question] = []
    while len(out) < sessions:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        out += [Question(a, b, f"add-{a}-{b}-{uuid.uuid4().hex[:8]}")] * repeats
    return out[:sessions]


def run_sessions(
    base_url: str,
    api_key: str,
    sessions: int,
    concurrency: int,
    *,
    repeats: int = 8,
    turns: int = 1,
    temperature: float = 1.0,
    stream: bool = False,
    seed: int = 0,
) -> list[float]:
    """Run `sessions` episodes, `concurrency` at a time, against the endpoint; the rewards in session order."""
    client = OpenAI(base_url=base_url, api_key=api_key or "unused", max_retries=0, timeout=600)
    feedback_url = base_url.rstrip("/") + "/feedback"
    todo = questions(sessions, repeats, random.Random(seed))
    try:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            futures = [
                pool.submit(run_session, client, feedback_url, q, turns=turns, temperature=temperature, stream=stream)
                for q in todo
            ]
            return [f.result() for f in futures]
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the explorer's OpenAI endpoint")
    parser.add_argument("--api-key", default="", help="the run's TRINITY_AUTH_TOKEN, if it has one")
    parser.add_argument("--sessions", type=int, default=64, help="episodes per round")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of --sessions episodes")
    parser.add_argument("--concurrency", type=int, default=16, help="episodes in flight at once")
    parser.add_argument("--repeats", type=int, default=8, help="episodes per question (one GRPO group)")
    parser.add_argument("--turns", type=int, default=1, help="tries per episode")
    parser.add_argument("--stream", action="store_true", help="stream the replies")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for round_index in range(args.rounds):
        rewards = run_sessions(
            args.url,
            args.api_key,
            args.sessions,
            args.concurrency,
            repeats=args.repeats,
            turns=args.turns,
            stream=args.stream,
            seed=args.seed + round_index,
        )
        health = httpx.get(args.url.rstrip("/").removesuffix("/v1") + "/health", timeout=30).json()
        print(f"round {round_index}: mean reward {statistics.fmean(rewards):.3f}, weights v{health['model_version']}")


if __name__ == "__main__":
    main()
