"""The explorer section of the run config: engine, workflow, sampling, evaluation, serve and bench modes.

`explorer.engine` picks the shape of `engine_options` (`VllmEngineOptions`, `TransformersEngineOptions`)
and a built-in `explorer.workflow` the shape of `workflow_options` (`WORKFLOW_OPTIONS`); a key the
chosen shape lacks is an error naming the keys it has. A workflow registered by a plugin takes its
options as a mapping, checked against its constructor when the explorer builds it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, FieldSerializationInfo, ValidationError, ValidationInfo, field_serializer, field_validator

from trinity.config.base import _check_devices, _Section
from trinity.config.registered import (
    AgentName,
    ChatEnvironmentName,
    RewardSpec,
    StepEnvironmentName,
    ToolName,
    WorkflowName,
)

DType = Literal["float32", "bfloat16", "float16"]
# How a model writes a tool call: Hermes / Qwen `<tool_call>{json}</tool_call>`, or Llama 3.1's bare JSON object.
ToolCallFormat = Literal["hermes", "llama3"]


class VllmEngineOptions(_Section):
    """`engine_options` of `engine: vllm`: vLLM's offline `LLM`, in-process (defaults measured on 2 CPU cores)."""

    dtype: DType | None = Field(
        default=None,
        description="sampling dtype, also the dtype weight updates are sent in; unset = bfloat16 on a GPU (updates "
        "sent in model.dtype, cast on load), model.dtype on a CPU",
    )
    max_model_len: int | None = Field(
        default=None, gt=0, description="context limit; unset = model.max_prompt_tokens + model.max_response_tokens"
    )
    kv_cache_space_gib: float = Field(
        default=1.0, gt=0, description="CPU build: KV cache GiB, fractions allowed (all resident: vLLM fills it)"
    )
    block_size: int | None = Field(
        default=None,
        gt=0,
        description="KV block in tokens (CPU build: a multiple of 32; unset = vLLM's 128 there); the samples of "
        "one prompt share its cached full blocks, so a block no longer than the prompt lets them share it",
    )
    enforce_eager: bool | None = Field(
        default=None,
        description="no CUDA graphs or compilation (faster start); unset = off on a GPU (CUDA graphs), on on a CPU",
    )
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = Field(
        default="processed_logprobs",
        description="log-probs of the distribution sampled from (after temperature, top-k, top-p), or the raw one",
    )
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1, description="GPU build: share of GPU memory used")
    tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        le=64,
        description="vLLM workers the model is split across; with more than one, each worker is a rank of the "
        "weight-sync group and receives every version itself (streamed)",
    )
    weight_bucket_bytes: int | None = Field(
        default=None,
        gt=0,
        description="bytes of tensors per in-place reload call (whole decoder layers); unset: 1 GiB for a staged "
        "version (in memory whole already: fewer calls), 64 MiB for a streamed one (what the engine holds beside "
        "the model)",
    )
    extra: dict[str, Any] = Field(default_factory=dict, description="more `vllm.LLM` keyword arguments, passed as is")

    @field_validator("extra")
    @classmethod
    def _no_parallelism_in_extra(cls, extra: dict[str, Any]) -> dict[str, Any]:
        # The weight-sync group counts one rank per worker: a parallel size it cannot see would leave ranks out.
        for key in ("tensor_parallel_size", "pipeline_parallel_size", "weight_transfer_config"):
            if key in extra:
                hint = "use engine_options.tensor_parallel_size" if key == "tensor_parallel_size" else "not supported"
                raise ValueError(f"{key} is set by Trinity, not through extra ({hint})")
        return extra


class TransformersEngineOptions(_Section):
    """`engine_options` of `engine: transformers`: Hugging Face `generate`, one request at a time."""

    dtype: DType | None = Field(
        default=None,
        description="sampling dtype, also the dtype weight updates are sent in; unset = bfloat16 on a GPU (updates "
        "sent in model.dtype, cast on load), model.dtype on a CPU",
    )
    device: str = Field(default="cpu", description="torch device of the model (`cpu`, `cuda`, `cuda:1`, ...)")


EngineOptions = VllmEngineOptions | TransformersEngineOptions
ENGINE_OPTIONS: dict[str, type[EngineOptions]] = {
    "vllm": VllmEngineOptions,
    "transformers": TransformersEngineOptions,
}


class MathWorkflowOptions(_Section):
    """`workflow_options` of `math` and `countdown`: one question, one answer per sample."""

    system_prompt: str | None = Field(default=None, description="system turn before the question; unset = none")
    use_chat_template: bool = Field(default=True, description="prompt through the tokenizer's chat template")


class MultiTurnWorkflowOptions(_Section):
    """`workflow_options` of `multi_turn`: model turns alternate with a chat environment's."""

    environment: ChatEnvironmentName = Field(default="guess_number", description="registered chat environment")
    max_turns: int = Field(default=4, ge=1, description="model turns per episode at most")
    system_prompt: str | None = Field(default=None, description="system turn before the task; unset = none")
    reward_fn: RewardSpec = Field(default="", description="reward of the last model turn, added to the environment's")


class ReactWorkflowOptions(_Section):
    """`workflow_options` of `react`: the model calls registered tools until it answers; the answer is scored."""

    tools: tuple[ToolName, ...] = Field(default=("calculator",), min_length=1, description="registered tools offered")
    tool_call_format: ToolCallFormat = Field(
        default="hermes",
        description="hermes: <tool_call>{json}</tool_call> (Qwen, ChatML, SmolLM2); llama3: a JSON object reply",
    )
    max_turns: int = Field(default=4, ge=1, description="model turns per episode at most (tool calls and the answer)")
    tool_timeout_s: float = Field(default=5.0, gt=0, description="a tool call running longer answers a timeout error")
    system_prompt: str | None = Field(default=None, description="system turn before the task, above the tool list")
    reward_fn: RewardSpec = Field(default="", description="reward of the final answer; empty = the task's reward_fn")


class AgentScopeWorkflowOptions(_Section):
    """`workflow_options` of `agentscope`: a registered AgentScope agent, each of its model calls an experience."""

    agent: AgentName = Field(default="react", description="registered agent function (`trinity.agents`)")
    reward_fn: RewardSpec = Field(default="", description="reward of an agent's text answer; empty = the task's")
    episode_timeout_s: float = Field(default=300.0, gt=0, description="an episode running longer is marked failed")


class _StepOptions(_Section):
    max_steps: int = Field(default=20, ge=1, description="steps per episode at most")
    gamma: float = Field(default=1.0, ge=0, le=1, description="discount of the per-step return-to-go")


class MultiStepWorkflowOptions(_StepOptions):
    """`workflow_options` of `multi_step`: one experience per step of a registered step environment."""

    environment: StepEnvironmentName = Field(default="frozen_lake", description="registered step environment")


class FrozenLakeWorkflowOptions(_StepOptions):
    """`workflow_options` of `frozen_lake`: one experience per step of a FrozenLake episode."""

    invalid_action_reward: float = Field(
        default=0.0, le=0, description="step reward of a reply that is no valid action (e.g. -0.1 teaches the format)"
    )


class TextWorldWorkflowOptions(FrozenLakeWorkflowOptions):
    """`workflow_options` of `textworld`: one experience per step of a TextWorld game."""

    games_dir: str = Field(
        default="", description="where generated games are compiled and cached; empty = ~/.cache/trinity/textworld"
    )


class ScienceWorldWorkflowOptions(FrozenLakeWorkflowOptions):
    """`workflow_options` of `scienceworld`: one experience per step of a ScienceWorld task."""

    max_listed_actions: int = Field(default=50, ge=1, description="valid actions an observation lists at most")


WorkflowOptions = (
    MathWorkflowOptions
    | MultiTurnWorkflowOptions
    | ReactWorkflowOptions
    | AgentScopeWorkflowOptions
    | MultiStepWorkflowOptions
    | FrozenLakeWorkflowOptions
    | TextWorldWorkflowOptions
    | ScienceWorldWorkflowOptions
)
WORKFLOW_OPTIONS: dict[str, type[WorkflowOptions]] = {
    "math": MathWorkflowOptions,
    "countdown": MathWorkflowOptions,
    "multi_turn": MultiTurnWorkflowOptions,
    "react": ReactWorkflowOptions,
    "agentscope": AgentScopeWorkflowOptions,
    "multi_step": MultiStepWorkflowOptions,
    "frozen_lake": FrozenLakeWorkflowOptions,
    "textworld": TextWorldWorkflowOptions,
    "scienceworld": ScienceWorldWorkflowOptions,
}


JUDGE_REWARDS = ("judge_ruler", "judge_rubric")  # the built-in rewards that need `explorer.judge`


class JudgeConfig(_Section):
    """`explorer.judge`: the model the `judge_ruler` and `judge_rubric` rewards ask for scores."""

    base_url: str = Field(
        default="",
        description="OpenAI-compatible endpoint (`http://host:8000/v1`); empty = the explorer starts `model` itself",
    )
    model: str = Field(
        min_length=1, description="model name sent to `base_url`; without one, the judge's Hugging Face directory"
    )
    engine: Literal["vllm", "transformers"] = Field(
        default="transformers", description="without `base_url`: the engine the judge model runs on"
    )
    api_key_env: str = Field(default="", description="environment variable holding the endpoint's bearer token")
    temperature: float = Field(default=0.0, ge=0, description="judge sampling temperature; 0 = greedy")
    max_tokens: int = Field(default=512, gt=0, description="tokens the judge may write per reply")
    timeout_seconds: float = Field(default=60.0, gt=0, description="one judge call running longer fails")
    max_attempts: int = Field(default=2, ge=1, description="calls per judgement before the fallback reward")
    fallback_reward: float = Field(default=0.0, description="reward of responses the judge failed to score (counted)")
    rubric: str = Field(default="", description="`judge_rubric`'s rubric for tasks without `payload.rubric`")


class ExplorerConfig(_Section):
    """Rollouts: the engine and its options, the workflow and its options, sampling, evaluation, serve and bench."""

    engine: Literal["vllm", "transformers"] = Field(default="vllm", description="rollout engine")
    engine_options: EngineOptions = Field(
        default_factory=VllmEngineOptions,
        validate_default=True,
        description="settings of the chosen engine (VllmEngineOptions, TransformersEngineOptions)",
    )
    workflow: WorkflowName = Field(default="math", description="registered workflow that turns a task into experiences")
    workflow_options: dict[str, Any] | WorkflowOptions = Field(
        default_factory=dict,
        validate_default=True,
        union_mode="left_to_right",  # a plugin's mapping stays a mapping; built-in shapes arrive as models
        description="settings of the chosen workflow (WORKFLOW_OPTIONS); a plugin workflow's constructor arguments",
    )
    num_workers: int = Field(default=1, ge=1, description="explorer processes in the run")
    devices: tuple[int, ...] | None = Field(
        default=None,
        description="`trinity run`: GPUs (indices on the host) of the explorers, split evenly in order (explorer i "
        "sees the i-th share: CUDA_VISIBLE_DEVICES); [] = none; unset = every GPU",
    )
    colocate: bool = Field(
        default=False,
        description="allow explorer.devices to share GPUs with trainer.devices (then lower "
        "engine_options.gpu_memory_utilization to leave the trainer room); overlapping devices are an error otherwise",
    )
    threads: int = Field(
        default=0,
        ge=0,
        description="`trinity run`: torch threads per explorer process; 0 = the cores split among explorers",
    )
    temperature: float = Field(default=1.0, ge=0, description="rollout sampling temperature; 0 = greedy")
    top_p: float = Field(default=1.0, gt=0, le=1, description="nucleus sampling mass (rollouts and evaluation)")
    top_k: int = Field(default=-1, description="sample among the k likeliest tokens; <= 0 = all")
    stop: tuple[str, ...] = Field(default=(), description="strings that end a response (not included in it)")
    reward_timeout_seconds: float = Field(default=10.0, gt=0, description="a reward call running longer fails")
    max_concurrent_rollouts: int = Field(
        default=32, ge=1, description="tasks rolled out at once when the engine batches concurrent calls (vLLM)"
    )
    rollout_timeout_seconds: float | None = Field(
        default=600.0,
        ge=0,
        description="a task's rollout (all its repeats) running longer fails; unset or 0 = no limit",
    )
    rollout_retries: int = Field(
        default=2, ge=0, description="new attempts of a failed rollout before its task is dropped (counted)"
    )
    max_explore_factor: float = Field(
        default=4.0,
        ge=1.0,
        description="while operators drop experiences (DAPO's dynamic sampling), explore more to fill the train "
        "batches, up to this many times the explore steps that would feed them without drops",
    )
    judge: JudgeConfig | None = Field(default=None, description="judge model of the judge rewards; unset = none")
    eval_interval: int = Field(default=0, ge=0, description="evaluate every N weight versions; 0 = never")
    eval_on_start: bool = Field(
        default=True, description="evaluate the starting weights (after the first batch, beside the first train step)"
    )
    eval_temperature: float = Field(default=1.0, ge=0, description="evaluation (and bench) sampling temperature")
    eval_repeat_times: int = Field(default=1, ge=1, description="samples per evaluated task (the k of pass@k)")
    # serve mode (trinity.explorer.openai_api): the OpenAI-compatible HTTP endpoint agents call
    openai_host: str = Field(default="127.0.0.1", description="serve: bind address; 0.0.0.0 to serve other hosts")
    openai_port: int = Field(
        default=0, ge=0, le=65535, description="serve: port; 0 = pick a free one (reported in events)"
    )
    session_ttl_seconds: float = Field(default=3600.0, gt=0, description="serve: sessions without feedback expire")
    served_model_name: str = Field(
        default="",
        max_length=256,
        description="serve: the model id replies and /v1/models give; empty = the run's name",
    )
    keep_serving_after_last_step: bool = Field(
        default=False,
        description="serve: after the last train step, answer calls (untrained) until the run is stopped; it then "
        "succeeds",
    )
    bench_output: str = Field(
        default="", description="bench: path of the JSON report; empty = <checkpoint_dir or cwd>/bench_report.json"
    )

    _devices = field_validator("devices")(_check_devices)

    @field_validator("engine_options", mode="before")
    @classmethod
    def _engine_shape(cls, value: Any, info: ValidationInfo) -> Any:
        engine = info.data.get("engine")
        if engine is None:
            return value  # `engine` itself is wrong; that error says so
        return _options(ENGINE_OPTIONS[engine], value, f"engine {engine!r}")

    @field_validator("workflow_options", mode="before")
    @classmethod
    def _workflow_shape(cls, value: Any, info: ValidationInfo) -> Any:
        shape = WORKFLOW_OPTIONS.get(info.data.get("workflow", ""))
        return value if shape is None else _options(shape, value, f"workflow {info.data['workflow']!r}")

    @field_serializer("engine_options", "workflow_options")
    def _only_set(self, options: _Section | dict[str, Any], info: FieldSerializationInfo) -> dict[str, Any]:
        # Only what the config set: a stage overlay that switches engine or workflow must not inherit
        # the previous shape's defaults as if they were its own keys.
        if isinstance(options, dict):
            return options
        return options.model_dump(mode=info.mode, exclude_unset=True)


def _options(shape: type[_Section], value: Any, owner: str) -> _Section:
    if isinstance(value, shape):
        return value
    if isinstance(value, _Section):  # options of another shape (a programmatic copy): re-check its keys
        value = value.model_dump(exclude_unset=True)
    try:
        return shape.model_validate(value)
    except ValidationError as err:
        unknown = any(e["type"] == "extra_forbidden" for e in err.errors())
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: "
            + ("unknown field" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, "))
            for e in err.errors()
        )
        known = f"; its fields: {', '.join(shape.model_fields)}" if unknown else ""
        raise ValueError(f"{problems} (for {owner}{known})") from None
