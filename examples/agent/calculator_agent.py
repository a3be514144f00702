"""A toy agent trained through Trinity's serve mode: arithmetic with a calculator tool.

It is an ordinary OpenAI-client agent. The only Trinity-specific parts are the session id it sends
with every call (`X-Session-Id`) and the reward it posts to `/feedback` when an episode ends.

    python examples/agent/calculator_agent.py --base-url http://127.0.0.1:8000/v1 --episodes 8
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import random
import re
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate + - * / arithmetic",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
SYSTEM = "Solve it. End with: Answer: <number>"
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculate(expression: str) -> str:
    """The tool: a safe evaluator (numbers, + - * /, unary minus, parentheses); errors come back as text."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        raise ValueError("only numbers, + - * / and parentheses")

    try:
        value = walk(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as err:
        return f"error: {err}"
    return str(int(value)) if float(value).is_integer() else str(value)


def reward(answer_text: str, expected: int) -> float:
    """1 if the last number in the final answer equals the expected result, else 0."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", answer_text)
    return 1.0 if numbers and float(numbers[-1]) == expected else 0.0


@dataclass
class Episode:
    session_id: str
    question: str
    expected: int
    final_text: str
    calls: int
    reward: float


def run_episode(
    client: httpx.Client, a: int, b: int, *, max_turns: int = 3, max_tokens: int = 64, temperature: float = 1.0
) -> Episode:
    """One episode: ask, run any tool calls, repeat; then post the reward for the whole session.

    `client.base_url` is the explorer's root (`http://host:port/`): calls go to `v1/chat/completions`,
    the reward to `feedback`.
    """
    session_id = uuid.uuid4().hex
    question = f"What is {a} * {b}?"
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    text, calls = "", 0
    for _ in range(max_turns):
        reply = client.post(
            "v1/chat/completions",
            headers={"X-Session-Id": session_id},
            json={
                "model": "policy",
                "messages": messages,
                "tools": [CALCULATOR],
                "temperature": temperature,
                "max_tokens": max_tokens,
            },
        )
        reply.raise_for_status()
        calls += 1
        message = reply.json()["choices"][0]["message"]
        messages.append(message)
        text = message.get("content") or ""
        if not message.get("tool_calls"):
            break
        for call in message["tool_calls"]:
            try:
                args = json.loads(call["function"]["arguments"])
                result = calculate(str(args.get("expression", "")))
            except (json.JSONDecodeError, AttributeError):
                result = "error: arguments must be a JSON object with an expression"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    score = reward(text, a * b)
    # The session's group: episodes of the same question are compared with each other (GRPO).
    feedback = {"session_id": session_id, "reward": score, "group_id": f"mul-{a}-{b}"}
    client.post("feedback", json=feedback).raise_for_status()
    return Episode(session_id, question, a * b, text, calls, score)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="the explorer's OpenAI endpoint")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=4, help="episodes per question (one GRPO group)")
    parser.add_argument("--api-key", default="", help="TRINITY_AUTH_TOKEN, if the run uses one")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    root = args.base_url.rstrip("/").removesuffix("/v1") + "/"
    with httpx.Client(base_url=root, headers=headers, timeout=300) as client:
        client.get("health").raise_for_status()
        done = 0
        while done < args.episodes:
            a, b = rng.randint(2, 9), rng.randint(2, 9)
            for _ in range(min(args.repeats, args.episodes - done)):
                ep = run_episode(client, a, b)
                done += 1
                print(json.dumps({"question": ep.question, "calls": ep.calls, "reward": ep.reward}))


if __name__ == "__main__":
    main()
