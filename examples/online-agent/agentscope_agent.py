"""AgentScope's own ReAct agent trained online through Trinity's serve mode, unchanged but for two lines.

The agent is AgentScope's `Agent` with an `OpenAIChatModel` and one tool, `add(a, b)`. The Trinity-specific
lines: the model's `base_url` (the explorer's endpoint) and an `X-Session-Id` header per episode (through
`client_kwargs`), then one POST to `/feedback` with the episode's reward. Every model call the agent makes
(the tool call, the answer after the tool's result) is trained with that reward.

    python examples/online-agent/agentscope_agent.py --url http://127.0.0.1:8000/v1 --sessions 64

Needs `pip install agentscope` (`make setup` installs it). The endpoint must fit the agent: its first prompt is
236 SmolLM2 tokens (AgentScope's runtime-state reminder included) and one tool call 32, which is why the
example's `model.max_prompt_tokens` is 512 and `max_response_tokens` 64.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import uuid

import httpx
from agent import Question, questions, reward  # the plain agent's tasks and scoring (same folder)
from agentscope.agent import Agent
from agentscope.credential import OpenAICredential
from agentscope.message import UserMsg
from agentscope.model import OpenAIChatModel
from agentscope.permission import PermissionBehavior, PermissionDecision
from agentscope.tool import FunctionTool, Toolkit
from pydantic import SecretStr

SYSTEM_PROMPT = "You add numbers. Call the add tool, then answer with just the number."


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def build_agent(base_url: str, api_key: str, session_id: str, max_tokens: int) -> Agent:
    model = OpenAIChatModel(
        credential=OpenAICredential(api_key=SecretStr(api_key or "unused"), base_url=base_url),  # Trinity: the endpoint
        model="policy",
        parameters=OpenAIChatModel.Parameters(max_tokens=max_tokens, temperature=1.0),
        stream=False,
        max_retries=0,
        client_kwargs={"default_headers": {"X-Session-Id": session_id}},  # Trinity: the episode of each call
    )
    allow = PermissionDecision(behavior=PermissionBehavior.ALLOW, message="")  # nobody to confirm tool calls
    return Agent(
        name="adder",
        system_prompt=SYSTEM_PROMPT,
        model=model,
        toolkit=Toolkit(tools=[FunctionTool(add, permission=allow)]),
    )


async def run_session(base_url: str, api_key: str, question: Question, max_tokens: int) -> tuple[float, str]:
    """One episode: the agent answers, its reward is posted; (reward, session id)."""
    session_id = uuid.uuid4().hex
    agent = build_agent(base_url, api_key, session_id, max_tokens)
    reply = await agent.reply(UserMsg(name="user", content=f"What is {question.a}+{question.b}?"))
    score = reward(reply.get_text_content() or "", question.a + question.b)
    # Trinity: the episode's reward; every call of the session is trained with it, in the question's group.
    async with httpx.AsyncClient(timeout=60) as client:
        feedback = {"session_id": session_id, "reward": score, "group_id": question.group_id}
        response = await client.post(f"{base_url.rstrip('/')}/feedback", json=feedback, headers=_auth(api_key))
        response.raise_for_status()
    return score, session_id


def _auth(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def run_sessions(
    base_url: str,
    api_key: str,
    sessions: int,
    concurrency: int,
    *,
    repeats: int = 8,
    max_tokens: int = 64,
    seed: int = 0,
) -> list[tuple[float, str]]:
    """`sessions` episodes, `concurrency` at a time; (reward, session id) in session order."""
    limit = asyncio.Semaphore(concurrency)

    async def bounded(question: Question) -> tuple[float, str]:
        async with limit:
            return await run_session(base_url, api_key, question, max_tokens)

    todo = questions(sessions, repeats, random.Random(seed))
    return list(await asyncio.gather(*(bounded(q) for q in todo)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the explorer's OpenAI endpoint")
    parser.add_argument("--api-key", default="", help="the run's TRINITY_AUTH_TOKEN, if it has one")
    parser.add_argument("--sessions", type=int, default=64, help="episodes per round")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of --sessions episodes")
    parser.add_argument("--concurrency", type=int, default=16, help="episodes in flight at once")
    parser.add_argument("--repeats", type=int, default=8, help="episodes per question (one GRPO group)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per reply (at most the run's limit)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for round_index in range(args.rounds):
        results = asyncio.run(
            run_sessions(
                args.url,
                args.api_key,
                args.sessions,
                args.concurrency,
                repeats=args.repeats,
                max_tokens=args.max_tokens,
                seed=args.seed + round_index,
            )
        )
        health = httpx.get(args.url.rstrip("/").removesuffix("/v1") + "/health", timeout=30).json()
        mean = statistics.fmean(score for score, _ in results)
        print(f"round {round_index}: mean reward {mean:.3f}, weights v{health['model_version']}")


if __name__ == "__main__":
    main()
