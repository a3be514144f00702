"""AgentScope agents trained in process: the `agentscope` workflow.

An agent is an async function `agent(task, model)` registered with `@AGENTS.register(name)` (or the
`trinity.agents` entry-point group). `model` is an AgentScope `OpenAIChatModel` wired to the explorer's
own engine through the serve-mode endpoint's app, called in this process without a socket: every call
the agent makes is sampled and recorded exactly as in `mode: serve` (prompt and response token ids,
sampling log-probs, the weight version), one session per episode. The agent returns the episode's reward
(a number: its environment's own score) or its final answer (text, scored by the task's `reward_fn`).

Each recorded call becomes one experience of its episode (`episode_id` the session, `step_index` the
call's index), all with the episode's reward; the `repeat_times` episodes of a task form one group, so
GRPO's and GiGPO's multi-step advantages apply. Only the tokens of each call are trained on: an agent
framework re-renders its history its own way, so the exact tokens of a call are all that is known.

The model samples with the run's `explorer.sampling` (temperature, top-p, top-k) and at most
`model.max_response_tokens` per call; an agent that changes them trains on log-probs the trainer does not
reproduce.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from trinity.explorer.engines.base import Engine
from trinity.explorer.openai_api import SESSION_HEADER, ServeBackend, create_app, in_process
from trinity.explorer.rewards import evaluate_reward
from trinity.explorer.sessions import SessionStore, feedback_experiences
from trinity.explorer.tools import TOOLS
from trinity.explorer.workflows.base import (
    WORKFLOWS,
    RolloutSettings,
    Workflow,
    apply_outcome,
    needs_package,
    new_id,
    reward_timer,
)
from trinity.registry import Registry
from trinity.runtime.logging import get_logger
from trinity.v1 import common_pb2

if TYPE_CHECKING:
    from agentscope.model import OpenAIChatModel

log = get_logger(__name__)

AgentFn = Callable[[common_pb2.Task, "OpenAIChatModel"], Awaitable[float | str]]
AGENTS: Registry[AgentFn] = Registry("agent")
_MODEL = "trinity"
_BASE_URL = "http://explorer.in-process/v1"  # never resolved: requests go to the app through the ASGI transport


@WORKFLOWS.register("agentscope")
class AgentScopeWorkflow(Workflow):
    """Runs `agent` (a registered name or the function) `repeat_times` times per task, concurrently.

    An episode that raises or runs past `episode_timeout_s` keeps the calls it made, marked failed with
    the reason (the trainer skips failed experiences); a task none of whose episodes made a call raises.
    """

    def __init__(self, agent: str | AgentFn = "react", reward_fn: str = "", episode_timeout_s: float = 300.0) -> None:
        needs_package("agentscope", "agentscope", "the agentscope workflow")
        self.agent = AGENTS.get(agent) if isinstance(agent, str) else agent
        self.default_reward = reward_fn
        self.episode_timeout_s = episode_timeout_s

    def run(self, task: common_pb2.Task, engine: Engine, settings: RolloutSettings) -> list[common_pb2.Experience]:
        return asyncio.run(self._run(task, engine, settings))

    async def _run(
        self, task: common_pb2.Task, engine: Engine, settings: RolloutSettings
    ) -> list[common_pb2.Experience]:
        sessions = SessionStore()
        backend = ServeBackend(
            engine=lambda: engine,
            put=lambda _experiences: 0,  # nothing is put from here: the workflow returns the experiences
            model_name=_MODEL,
            run_id=settings.run_id,
            max_tokens=settings.sampling.max_tokens,
        )
        group_id = new_id()
        async with in_process(create_app(backend, sessions)) as transport:
            episodes = [self._episode(task, transport, settings) for _ in range(settings.repeat_times)]
            outcomes = await asyncio.gather(*episodes)
        out: list[common_pb2.Experience] = []
        errors = []
        for session_id, result in outcomes:
            taken = sessions.close(session_id)
            if isinstance(result, BaseException):
                errors.append(f"{type(result).__name__}: {result}")
            if taken is None:  # the agent never called the model: there is nothing to train on
                continue
            experiences = feedback_experiences(taken, run_id=settings.run_id, reward=0.0, group_id=group_id, task=task)
            self._score(experiences, result, task, settings)
            out.extend(experiences)
        if not out and errors:
            raise RuntimeError(f"every episode of task {task.id!r} failed: {errors[0]}")
        return out

    async def _episode(self, task: common_pb2.Task, transport: Any, settings: RolloutSettings) -> tuple[str, Any]:
        """(session id, what the agent returned or the exception it ended with)."""
        session_id = uuid.uuid4().hex
        model = _chat_model(transport, session_id, settings)
        try:
            return session_id, await asyncio.wait_for(self.agent(task, model), self.episode_timeout_s)
        except TimeoutError:
            return session_id, TimeoutError(f"the episode ran past episode_timeout_s={self.episode_timeout_s:g}")
        except Exception as err:  # noqa: BLE001 - a user's agent may raise anything; the episode is marked failed
            log.warning("agentscope.episode_failed", task_id=task.id, error=f"{type(err).__name__}: {err}")
            return session_id, err

    def _score(
        self, experiences: list[common_pb2.Experience], result: Any, task: common_pb2.Task, settings: RolloutSettings
    ) -> None:
        if isinstance(result, BaseException):
            for exp in experiences:
                exp.failed = True
                exp.error = f"agent: {type(result).__name__}: {result}"
            return
        if isinstance(result, bool) or not isinstance(result, int | float | str):
            raise TypeError(f"an agent returns its reward (a number) or its answer (text), not {type(result).__name__}")
        if isinstance(result, str):
            with reward_timer(settings):
                outcome = evaluate_reward(self.reward_fn(task), result, task, settings.reward_timeout_s)
            for exp in experiences:
                apply_outcome(exp, outcome)
                exp.response_text = result
            return
        for exp in experiences:
            exp.reward = float(result)
            exp.reward_components["agent"] = float(result)


def _chat_model(transport: Any, session_id: str, settings: RolloutSettings) -> OpenAIChatModel:
    """An AgentScope chat model whose calls reach the in-process endpoint under `session_id`."""
    import httpx
    from agentscope.credential import OpenAICredential
    from agentscope.model import OpenAIChatModel
    from pydantic import SecretStr

    sampling = settings.sampling
    client = httpx.AsyncClient(transport=transport, base_url=_BASE_URL, headers={SESSION_HEADER: session_id})
    return OpenAIChatModel(
        credential=OpenAICredential(api_key=SecretStr("in-process"), base_url=_BASE_URL),
        model=_MODEL,
        parameters=OpenAIChatModel.Parameters(
            max_tokens=sampling.max_tokens, temperature=sampling.temperature, top_p=sampling.top_p
        ),
        stream=False,
        max_retries=0,
        client_kwargs={"http_client": client},
        extra_body={"top_k": sampling.top_k} if sampling.top_k > 0 else None,
    )


@AGENTS.register("react")
async def react_agent(task: common_pb2.Task, model: OpenAIChatModel) -> str:
    """AgentScope's own ReAct agent with the `calculator` tool, asked the task's prompt; returns its final text."""
    from agentscope.agent import Agent, InjectionConfig
    from agentscope.message import UserMsg
    from agentscope.tool import FunctionTool, Toolkit

    agent = Agent(
        name="assistant",
        system_prompt="You are a helpful assistant. Use the calculator for arithmetic, then answer with the number.",
        model=model,
        toolkit=Toolkit(tools=[FunctionTool(TOOLS.get("calculator"), permission=_allow())]),
        # The clock it would inject makes every prompt different and costs a small model's context.
        injection_config=InjectionConfig(inject_runtime_state=False),
    )
    reply = await agent.reply(UserMsg(name="user", content=task.prompt))
    return str(reply.get_text_content() or "")


def _allow() -> Any:
    """A standing permission: a trained agent has no user to confirm each tool call."""
    from agentscope.permission import PermissionBehavior, PermissionDecision

    return PermissionDecision(behavior=PermissionBehavior.ALLOW, message="")
