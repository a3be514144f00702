"""End to end against TRL's `GRPOTrainer` at its best: seconds per step, held-out accuracy against wall time, and
the peak memory of every process each side starts.

    python -m benchmarks.bench_e2e            # TRL 16 steps per configuration, ours 32 (tens of minutes each)
    python -m benchmarks.bench_e2e --quick    # 4 steps each (a smoke run, still minutes: the real model)
    python -m benchmarks.bench_e2e --quick --skip-ours --trl-configs bf16   # one TRL configuration alone

Both sides train SmolLM2-135M-Instruct with GRPO on the quickstart additions (examples/quickstart): 8 prompts x 8
samples per step (one optimizer step on them, or two of 32 in TRL's `+mb2` rows and ours), 16 completion tokens,
temperature 1.0, lr 1e-5 constant, AdamW (weight decay 0.01, grad-norm clip 1.0), no KL term, token-mean loss,
the same `accuracy` reward (last number equals the answer), and the same chat template. Held-out accuracy: 20
unseen additions x 8 samples at temperature 1.0 at the start and every 4 steps.

Ours is `trinity run` in a subprocess (Redis + gateway + buffer + trainer + a vLLM explorer). TRL runs in a
subprocess of its own (`--trl-worker`, 2 torch threads), once per configuration in `TRL_CONFIGS`, one after the
other: fp32 with HF `generate`, `bf16=True` (accelerate's CPU bf16 autocast), vLLM colocated in the trainer
process (the vLLM CPU build), and on the fastest of those a larger generation batch (`+gen2`) and each step's batch
in two optimizer steps (`+mb2`, as ours). A configuration that fails is a row saying where, and the others still
run. `compare` sets ours against the fastest that ran.

Clock accounting (the same rule for both): time starts when the subprocess is launched, so it includes imports,
model loading and service start-up, and the time spent on held-out evaluation is taken out.
- TRL: the evaluation runs in a callback between optimizer steps; its duration is measured and subtracted.
- Ours: the explorer times each evaluation and reports it with the result; that duration is subtracted. The
  explorer evaluates after putting a batch, so training may run meanwhile: both then share the cores, and
  the slower training that results stays on our clock. The raw clock (eval included) is kept too.

Memory: the peak over time of the summed RSS of the launched process and all its descendants
(`benchmarks.process_memory`), so ours counts Redis, every service and vLLM's processes.

The question is "how soon does ours reach the held-out accuracy TRL ends with", so ours runs more optimizer
steps than TRL (`--ours-steps`, default twice as many): that lets the curve show when it gets there, and what it
reaches within TRL's wall time. Every other setting is the same on both sides.

Writes benchmarks/results/e2e.json and e2e.png (`e2e_quick.*` with --quick, so a smoke run keeps the full result;
`*_trl_only` with --skip-ours).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from benchmarks.process_memory import ProcessTreeSampler, TreeMemory

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
QUICKSTART = ROOT / "examples" / "quickstart"
EVAL_INTERVAL = 4
THREADS = 2


# ---- shared task data and reward ------------------------------------------------------------------------------


def _rows(name: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in (QUICKSTART / name).read_text().splitlines() if line.strip()]


def _score(text: str, answer: str) -> float:
    """Our `accuracy` reward itself, so both systems grade with one rule."""
    from trinity.explorer.rewards.math import accuracy_reward
    from trinity.v1 import common_pb2

    return accuracy_reward(text, common_pb2.Task(answer=answer))


def _quickstart_config() -> dict[str, Any]:
    import yaml

    return yaml.safe_load((QUICKSTART / "config.yaml").read_text())


# ---- ours ------------------------------------------------------------------------------------------------------


def override(config: dict[str, Any], assignment: str) -> None:
    """Set `section.key=value` (a dotted path; the value read as YAML) in `config`, in place."""
    import yaml

    path, sep, value = assignment.partition("=")
    if not sep or not path:
        raise ValueError(f"--ours-set {assignment!r}: expected a dotted key, '=' and a value (explorer.threads=2)")
    *parents, key = path.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[key] = yaml.safe_load(value)


def _run_ours(
    steps: int, workdir: Path, overrides: tuple[str, ...] = (), env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The quickstart as it ships (bf16 matmuls and sampling, one-step-off), only its step budget changed (and
    `overrides`, `--ours-set`, for measuring one lever against the shipped settings; `env` on top of this
    process's environment)."""
    import yaml

    config = _quickstart_config()
    config["name"] = "bench-e2e"
    config["buffer"]["total_steps"] = steps
    for assignment in overrides:
        override(config, assignment)
    for section in [config["buffer"]["taskset"], *config["buffer"]["eval_tasksets"]]:
        section["path"] = str((QUICKSTART / section["path"]).resolve())  # the config moves to workdir
    config["monitor"]["tensorboard"] = False
    config_path = workdir / "ours.yaml"
    config_path.write_text(yaml.safe_dump(config))
    output = workdir / "ours"
    command = [sys.executable, "-m", "trinity.cli", "run", "--config", str(config_path), "--output", str(output)]
    proc = _launch([*command, "--quiet"], {**os.environ, **(env or {})}, timeout=None, launched=time.time())
    summary_path = output / "summary.json"
    if proc.returncode != 0 or not summary_path.exists():
        raise RuntimeError(f"trinity run failed (exit {proc.returncode}):\n{proc.output[-3000:]}")
    summary = json.loads(summary_path.read_text())
    return {
        **_ours_from_summary(summary, proc.launched, steps),
        **proc.memory_fields(),
        "startup_seconds": startup_milestones(output / "logs", summary, proc.launched),
    }


def _first_event_seconds(log: Path, event: str, launched: float) -> float | None:
    """Seconds from `launched` to the first structured log line of `event` in `log` (None: never logged)."""
    from datetime import datetime

    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if line.startswith("{") and f'"event": "{event}"' in line:
            stamp = json.loads(line)["timestamp"]
            return round(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - launched, 2)
    return None


def startup_milestones(logs: Path, summary: dict[str, Any], launched: float) -> dict[str, float | None]:
    """Where the time before the first optimizer step goes, in seconds since launch on the raw clock: each
    service serving, the weight-sync group formed (the trainer has its model, the explorer its vLLM engine),
    the first batch put, the first step trained. The step-0 evaluation sits between the group and the batch."""
    milestones: dict[str, float | None] = {
        f"{name}_serving": _first_event_seconds(logs / f"{name}.log", "service.serving", launched)
        for name in ("gateway", "buffer", "trainer", "explorer-0")
    }
    milestones["sync_group_ready"] = _first_event_seconds(logs / "trainer.log", "weights.group_ready", launched)
    firsts = {"first_batch_put": summary["explore"], "first_step_trained": summary["train"]}
    for name, rows in firsts.items():
        milestones[name] = round(rows[0]["unix_ms"] / 1000 - launched, 2) if rows else None
    return milestones


@dataclass
class Launched:
    """A finished (or killed) subprocess: its exit, its output and what its process tree held at most."""

    returncode: int
    output: str
    launched: float  # unix seconds at the launch: the start of its clock
    memory: TreeMemory
    timed_out: bool

    def memory_fields(self) -> dict[str, Any]:
        return {"peak_rss_mb": round(self.memory.peak_total_mb, 1), "memory": self.memory.as_dict()}


def _launch(command: list[str], env: dict[str, str], timeout: float | None, launched: float) -> Launched:
    """Run `command` from the repository root to its end (or `timeout`), sampling its process tree's RSS.
    `launched`: the caller's `time.time()` just before, which the command may need to know too."""
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timed_out = False
    with ProcessTreeSampler(proc.pid) as sampler:
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_tree(proc)
            output, _ = proc.communicate()
    return Launched(proc.returncode, output, launched, sampler.result(), timed_out)


def _kill_tree(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the process we started and every process it started, by pid (a hung run must not outlive us)."""
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in reversed(tree):
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def _eval_spans(summary: dict[str, Any]) -> list[tuple[float, float]]:
    """(start, end) unix seconds of each evaluation, as the explorer timed it (`seconds` of its eval event)."""
    return [(row["unix_ms"] / 1000 - row["seconds"], row["unix_ms"] / 1000) for row in summary["eval"]]


def _ours_from_summary(summary: dict[str, Any], launched: float, steps: int) -> dict[str, Any]:
    spans = _eval_spans(summary)
    durations = [end - start for start, end in spans]

    def clock(unix_s: float) -> float:
        """Seconds since launch minus the evaluation time spent before `unix_s`."""
        spent = sum(d for (_, end), d in zip(spans, durations, strict=True) if end <= unix_s)
        return unix_s - launched - spent

    evals = [
        {
            "step": int(row["model_version"]),
            "accuracy": row["accuracy"],
            "clock_seconds": clock(end - d),  # the eval's start, on the eval-free clock
            "raw_seconds": end - d - launched,  # the same moment with earlier evaluations left in
            "eval_seconds": d,
        }
        for row, (_, end), d in zip(summary["eval"], spans, durations, strict=True)
    ]
    train_times = [r["unix_ms"] / 1000 for r in summary["train"]]
    gaps = [clock(b) - clock(a) for a, b in itertools.pairwise(train_times)]
    rewards = [
        {"step": int(r["step"]), "reward_mean": r["reward_mean"], "clock_seconds": clock(r["unix_ms"] / 1000)}
        for r in summary["explore"]
    ]
    return {
        "system": "trinity run (vLLM explorer + torch trainer, 2 threads each)",
        "steps": len(summary["train"]),
        "requested_steps": steps,
        "state": summary["state"],
        "seconds_per_step": statistics.median(gaps) if gaps else float("nan"),
        "seconds_per_step_mean": statistics.fmean(gaps) if gaps else float("nan"),
        "trainer_compute_seconds_per_step": statistics.median([r["seconds"] for r in summary["train"]])
        if summary["train"] and "seconds" in summary["train"][0]
        else None,
        "first_step_clock_seconds": clock(train_times[0]) if train_times else None,
        "total_clock_seconds": clock(train_times[-1]) if train_times else None,
        "raw_wall_seconds": summary["wall_seconds"],
        "evals": evals,
        "rewards": rewards,
    }


# ---- TRL -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrlConfig:
    """One way to run TRL, as `GRPOConfig` options on top of the shared settings in `trl_worker`."""

    bf16: bool = False
    vllm: bool = False
    steps_per_generation: int = 1
    minibatches: int = 1  # optimizer steps per step's batch of 8 prompts x 8 (see `+mbN` below)
    system: str = ""

    def grpo_options(self) -> dict[str, Any]:
        generation = self.steps_per_generation * self.minibatches
        return {"bf16": self.bf16, "use_vllm": self.vllm, "steps_per_generation": generation}


# Each one a user chasing speed on a CPU would turn on, the fp32 row kept as the baseline. GRPOConfig's own default
# is bf16=True; on a CPU that is accelerate's torch.autocast("cpu", bfloat16) around the model's forward (fp32
# master weights and optimizer), which covers HF `generate` too. vLLM colocated runs the engine in the trainer
# process (`distributed_executor_backend="external_launcher"`, weights copied in by `load_weights` every step);
# it loads the checkpoint in its own dtype (fp32: TRL passes none), on top of bf16 training. On vLLM's CPU build
# (0.32) the first copy fails: the build repacks each linear layer's weight for its CPU GEMM after loading
# (`UnquantizedLinearMethod.process_weights_after_loading`), and the Parameter left behind has no `weight_loader`;
# the row then says so (AttributeError at vllm/model_executor/layers/linear.py, via TRL's `sync_weights`).
TRL_CONFIGS = {
    "fp32": TrlConfig(system="TRL GRPOTrainer (HF generate, fp32 CPU)"),
    "bf16": TrlConfig(bf16=True, system="TRL GRPOTrainer (HF generate, bf16 autocast CPU)"),
    "vllm-colocate": TrlConfig(
        bf16=True, vllm=True, system="TRL GRPOTrainer (vLLM colocate CPU build, bf16 autocast training)"
    ),
}
# `BASE+genN` (e.g. `bf16+gen2`): BASE with `steps_per_generation=N`. Each optimizer step still trains on 8 prompts x
# 8 samples, but one generation call makes N steps' worth (8N prompts x 8) and the next N-1 steps train on that
# store: N times fewer, N times larger generation batches (fewer decode passes for the same tokens), at the cost of
# samples up to N-1 optimizer steps old (TRL then computes their old log-probs for the PPO ratio).
# `BASE+mbN` (e.g. `bf16+mb2`): BASE training each step's 8 prompts x 8 in N optimizer steps of 64/N completions
# (`per_device_train_batch_size=64/N`, `steps_per_generation=N`): TRL's counterpart of `trainer.mini_batch_size`.
# A row's steps, step times and evaluations still count batches of 8 prompts x 8, N optimizer steps each.
# `fastest+...`: on the fastest configuration (seconds per step) that ran before it in the same invocation.
DEFAULT_TRL_CONFIGS = ("fp32", "bf16", "vllm-colocate", "fastest+gen2", "fastest+mb2")


def trl_config(spec: str) -> TrlConfig:
    """The configuration a resolved spec names: a key of `TRL_CONFIGS`, optionally `+genN`."""
    base, _, extra = spec.partition("+")
    suffix = re.fullmatch(r"(gen|mb)([1-9]\d*)", extra)
    if base not in TRL_CONFIGS or (extra and suffix is None):
        known = ", ".join([*TRL_CONFIGS, "fastest"])
        raise ValueError(
            f"TRL configuration {spec!r}: one of {known}, optionally followed by +genN or +mbN (e.g. bf16+gen2)"
        )
    config = TRL_CONFIGS[base]
    if suffix is None:
        return config
    kind, n = suffix.groups()
    if kind == "gen":
        return replace(config, steps_per_generation=int(n), system=f"{config.system}, steps_per_generation={n}")
    return replace(config, minibatches=int(n), system=f"{config.system}, {n} optimizer steps per batch")


def _resolve(spec: str, done: list[dict[str, Any]]) -> str:
    """`fastest+...` -> the fastest finished row's name in its place; other specs as they are."""
    base, plus, extra = spec.partition("+")
    if base != "fastest":
        trl_config(spec)  # a typo fails before any run
        return spec
    ran = [r for r in done if "failed" not in r and "+" not in r["config"]]
    if not ran:
        raise ValueError(f"{spec}: no configuration before it ran")
    return min(ran, key=lambda r: r["seconds_per_step"])["config"] + plus + extra


# vLLM's CPU build as our explorer runs it (trinity.explorer.engines.vllm_engine): the engine in this process (the
# only way `external_launcher` runs) and a 1 GiB KV cache, plenty for 128 sequences of 112 tokens.
VLLM_CPU_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}


def _run_trl(spec: str, steps: int, workdir: Path, model_path: str) -> dict[str, Any]:
    """One TRL configuration in a worker subprocess: its row, or `{"failed": ...}` saying where it broke."""
    config = trl_config(spec)
    out = workdir / f"trl-{spec}.json"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(THREADS),
        "OMP_WAIT_POLICY": "PASSIVE",
        "TOKENIZERS_PARALLELISM": "false",
        **(VLLM_CPU_ENV if config.vllm else {}),
    }
    launched = time.time()
    command = [sys.executable, "-m", "benchmarks.bench_e2e", "--trl-worker", "--trl-configs", spec]
    command += ["--trl-steps", str(steps), "--model", model_path, "--launched", repr(launched)]
    command += ["--out", str(out), "--workdir", str(workdir / f"trl-{spec}")]
    # A generous bound (fp32 takes ~40 s a step): it is there for a hang, which must not stop the other rows.
    timeout = 900 + 180 * steps
    proc = _launch(command, env, timeout, launched)
    (workdir / f"trl-{spec}.log").write_text(proc.output)
    row: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    if proc.timed_out:
        row["failed"] = f"timed out after {timeout} s; last output: {proc.output[-1500:]}"
    elif proc.returncode != 0 and "failed" not in row:
        row["failed"] = f"worker exit {proc.returncode}; last output: {proc.output[-1500:]}"
    return {"config": spec, "system": config.system, "options": config.grpo_options(), **row, **proc.memory_fields()}


def _heldout_accuracy(model: Any, tokenizer: Any, rows: list[dict[str, str]], samples: int, max_new: int) -> float:
    """Sampled accuracy of `model` on `rows`: each prompt `samples` times, temperature 1.0, `max_new` tokens."""
    import torch

    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": r["question"]}], tokenize=False, add_generation_prompt=True
        )
        for r in rows
    ]
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # decoder-only generation continues from the right edge
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    tokenizer.padding_side = side
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(
            **batch,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new,
            num_return_sequences=samples,
            pad_token_id=tokenizer.pad_token_id,
        )
    model.train(was_training)
    texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    answers = [r["answer"] for r in rows for _ in range(samples)]  # generate repeats each prompt in place
    return statistics.fmean(_score(t, a) for t, a in zip(texts, answers, strict=True))


def _failure(err: BaseException) -> dict[str, Any]:
    """What broke and where: the deepest frame inside TRL or vLLM (else the deepest), the TRL frame that led
    there, and the last frames."""
    frames = traceback.extract_tb(err.__traceback__)

    def inside(*packages: str) -> list[traceback.FrameSummary]:
        return [f for f in frames if any(f"{os.sep}{pkg}{os.sep}" in f.filename for pkg in packages)]

    def where(frame: traceback.FrameSummary) -> str:
        name = frame.filename.split(f"site-packages{os.sep}")[-1].removeprefix(f"{ROOT}{os.sep}")
        return f"{name}:{frame.lineno} in {frame.name}"

    deepest, trl = inside("trl", "vllm") or frames, inside("trl")
    at, via = (deepest[-1] if deepest else None), (trl[-1] if trl else None)
    message = f"{type(err).__name__}: {err}"
    if err.__cause__ is not None:
        message += f" (from {type(err.__cause__).__name__}: {err.__cause__})"
    if at is not None:
        message += f" at {where(at)}" + (f" (via {where(via)})" if via is not None and via is not at else "")
    return {
        "failed": message,
        "failed_at": where(at) if at else None,
        "failed_via_trl": where(via) if via else None,
        "traceback": [where(f) for f in frames[-12:]],
    }


def trl_worker(spec: str, steps: int, model_path: str, launched: float, out: Path, workdir: Path) -> None:
    """One TRL GRPO run with the quickstart's settings and configuration `spec`; writes its step times, rewards and
    eval curve to `out`, or, if it breaks, what broke and where (the caller's row says so and the benchmark goes on)."""
    record: dict[str, Any] = {"evals": [], "step_seconds": [], "rewards": [], "sampling": []}
    try:
        _trl_train(trl_config(spec), steps, model_path, launched, workdir, record)
    except Exception as err:
        record.update(_failure(err))
        out.write_text(json.dumps(record, indent=2))
        raise
    out.write_text(json.dumps(record, indent=2))


def _trl_train(
    config: TrlConfig, steps: int, model_path: str, launched: float, workdir: Path, record: dict[str, Any]
) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(THREADS)
    qs = _quickstart_config()
    group = int(qs["algorithm"]["repeat_times"])
    prompts_per_step = int(qs["buffer"]["batch_size"])
    max_new = int(qs["model"]["max_response_tokens"])
    eval_rows = _rows("eval.jsonl")
    train = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["question"]}], "answer": r["answer"]} for r in _rows("train.jsonl")]
    )

    def accuracy(completions: list[Any], answer: list[str], **_: Any) -> list[float | None]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [_score(t, a) for t, a in zip(texts, answer, strict=True)]

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    # fp32 weights in every configuration: bf16=True autocasts around them, as it does for a model TRL loads itself
    # from this (fp32) checkpoint.
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    vllm_options: dict[str, Any] = (
        {
            "vllm_mode": "colocate",
            "vllm_tensor_parallel_size": 1,
            "vllm_max_model_length": int(qs["model"]["max_prompt_tokens"]) + max_new,
        }
        if config.vllm
        else {}
    )
    args = GRPOConfig(
        output_dir=str(workdir),
        use_cpu=True,
        **config.grpo_options(),
        **vllm_options,
        max_steps=steps * config.minibatches,
        per_device_train_batch_size=prompts_per_step * group // config.minibatches,  # completions per optimizer step
        gradient_accumulation_steps=1,
        num_generations=group,
        max_completion_length=max_new,
        temperature=float(qs["explorer"]["temperature"]),
        top_k=0,
        top_p=1.0,
        learning_rate=float(qs["trainer"]["optimizer"]["lr"]),
        lr_scheduler_type="constant",
        weight_decay=0.01,
        max_grad_norm=1.0,
        beta=0.0,
        loss_type="dapo",  # token mean over the batch, like our token-mean GRPO loss
        scale_rewards="group",
        num_iterations=1,
        gradient_checkpointing=False,  # TRL turns it on by default; ours does not checkpoint, and it costs time
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=int(qs["seed"]),
        dataloader_num_workers=0,
    )
    excluded = 0.0  # seconds of held-out evaluation taken off TRL's clock

    def clock() -> float:
        return time.time() - launched - excluded

    def evaluate(step: int, trained: Any) -> None:
        nonlocal excluded
        at = clock()
        started = time.perf_counter()
        torch.manual_seed(10_000 + step)
        acc = _heldout_accuracy(trained, tokenizer, eval_rows, int(qs["explorer"]["eval_repeat_times"]), max_new)
        spent = time.perf_counter() - started
        excluded += spent
        record["evals"].append({"step": step, "accuracy": acc, "clock_seconds": at, "eval_seconds": spent})
        print(f"trl eval @ step {step}: accuracy {acc:.3f} ({spent:.0f}s, clock {at:.0f}s)", flush=True)

    class Timing(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.began = 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            evaluate(0, kw["model"])

        # A step is a batch of 8 prompts x 8: `config.minibatches` optimizer steps (TRL's `global_step`).
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step % config.minibatches == 0:
                self.began = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            done, rest = divmod(state.global_step, config.minibatches)
            if rest:
                return
            record["step_seconds"].append(time.perf_counter() - self.began)
            record.setdefault("step_clock", []).append(clock())
            if done % EVAL_INTERVAL == 0 or done == steps:
                evaluate(done, kw["model"])

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "reward" in logs:
                step = state.global_step / config.minibatches
                record["rewards"].append({"step": step, "reward_mean": float(logs["reward"]), "clock_seconds": clock()})
            # With vLLM: how far its sampling log-probs sit from the trainer's (stale weights would show here).
            sampling = {k: float(v) for k, v in (logs or {}).items() if k.startswith("sampling/")}
            if sampling:
                record["sampling"].append({"step": state.global_step, **sampling})

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=accuracy,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[Timing()],
    )
    record["setup_clock_seconds"] = clock()
    trainer.train()
    step_clock = record.pop("step_clock", [])
    gaps = [b - a for a, b in itertools.pairwise(step_clock)]
    record.update(
        {
            "steps": len(record["step_seconds"]),
            "requested_steps": steps,
            "seconds_per_step": statistics.median(gaps) if gaps else statistics.median(record["step_seconds"]),
            "seconds_per_step_mean": statistics.fmean(gaps) if gaps else statistics.fmean(record["step_seconds"]),
            "step_seconds_median": statistics.median(record["step_seconds"]),
            "first_step_clock_seconds": step_clock[0] if step_clock else None,
            "total_clock_seconds": step_clock[-1] if step_clock else None,
            "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # this process alone
        }
    )


# ---- comparison ------------------------------------------------------------------------------------------------


def _first_reaching(evals: list[dict[str, Any]], target: float, key: str = "clock_seconds") -> float | None:
    for row in sorted(evals, key=lambda r: r[key]):
        if row["accuracy"] >= target - 1e-9:
            return float(row[key])
    return None


LEVELS = (0.5, 0.75, 0.9)
GOAL_SPEEDUP_TO_090 = 5.0  # issue 18: 0.90 held-out at least 5x sooner than the fastest TRL configuration
GOAL_PEAK_RSS_RATIO = 0.5  # ... with the whole stack's peak RSS at most half of that TRL's


def _final(evals: list[dict[str, Any]]) -> dict[str, Any]:
    return max(evals, key=lambda r: r["step"])


def fastest_trl(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The TRL row that ran and reached 0.90 held-out soonest; when none did, the one soonest at its own final
    accuracy. None when no row has an evaluation curve."""

    def key(row: dict[str, Any]) -> tuple[int, float]:
        t90 = _first_reaching(row["evals"], 0.9)
        if t90 is not None:
            return (0, t90)
        return (1, _first_reaching(row["evals"], _final(row["evals"])["accuracy"]) or float("inf"))

    ran = [r for r in rows if "failed" not in r and r.get("evals")]
    return min(ran, key=key) if ran else None


def compare(ours: dict[str, Any], trl: dict[str, Any]) -> dict[str, Any]:
    """Ours against one TRL row: time to TRL's final held-out accuracy and to fixed levels, seconds per step,
    peak RSS, and issue 18's goal.

    `speedup_*` is TRL's time over ours (above 1: ours is sooner); None when ours never reached it.
    The `_eval_included` variant keeps ours' in-line evaluations on its clock (TRL's stay excluded): a bound
    that cannot flatter ours, since part of our evaluation overlaps training.
    """
    final = _final(trl["evals"])
    trl_total = float(final["clock_seconds"])
    ours_time = _first_reaching(ours["evals"], final["accuracy"])
    ours_raw = _first_reaching(ours["evals"], final["accuracy"], key="raw_seconds")
    within = [r for r in ours["evals"] if r["clock_seconds"] <= trl_total]
    levels = {
        f"{level:.2f}": {
            "ours": (o := _first_reaching(ours["evals"], level)),
            "trl": (t := _first_reaching(trl["evals"], level)),
            "speedup": t / o if o and t else None,
        }
        for level in LEVELS
    }
    speedup_090 = levels["0.90"]["speedup"]
    rss_ratio = ours["peak_rss_mb"] / trl["peak_rss_mb"] if trl.get("peak_rss_mb") else None
    return {
        "trl_configuration": trl["config"],
        "trl_final_accuracy": final["accuracy"],
        "trl_time_to_final_seconds": trl_total,
        "trl_first_reached_final_seconds": _first_reaching(trl["evals"], final["accuracy"]),
        "ours_final_accuracy": _final(ours["evals"])["accuracy"] if ours["evals"] else None,
        "ours_time_to_trl_final_seconds": ours_time,
        "ours_accuracy_within_trl_total_time": max(within, key=lambda r: r["clock_seconds"])["accuracy"]
        if within
        else None,
        "ours_time_to_trl_final_seconds_eval_included": ours_raw,
        "speedup_to_trl_final_accuracy": trl_total / ours_time if ours_time else None,
        "speedup_to_trl_final_accuracy_eval_included": trl_total / ours_raw if ours_raw else None,
        "seconds_per_step_ours": ours["seconds_per_step"],
        "seconds_per_step_trl": trl["seconds_per_step"],
        "seconds_per_step_ratio_trl_over_ours": trl["seconds_per_step"] / ours["seconds_per_step"],
        # With steps_per_generation > 1 TRL's steps alternate between generating and not: the median then picks
        # one kind, the mean over the run does not.
        "seconds_per_step_mean_ratio_trl_over_ours": trl["seconds_per_step_mean"] / ours["seconds_per_step_mean"],
        # Final accuracies sit within sampling noise of each other (160 samples: about +-0.03), so also the
        # time each side first reached a few fixed levels, and TRL's time over ours for each.
        "time_to_accuracy_seconds": levels,
        "peak_rss_mb_ours": ours["peak_rss_mb"],
        "peak_rss_mb_trl": trl["peak_rss_mb"],
        "peak_rss_ratio_ours_over_trl": rss_ratio,
        "goal_speedup_to_0.90": GOAL_SPEEDUP_TO_090,
        "goal_speedup_met": speedup_090 is not None and speedup_090 >= GOAL_SPEEDUP_TO_090,
        "goal_peak_rss_ratio": GOAL_PEAK_RSS_RATIO,
        "goal_peak_rss_met": rss_ratio is not None and rss_ratio <= GOAL_PEAK_RSS_RATIO,
    }


def table(ours: dict[str, Any] | None, trl_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per run, ours first: what a closing note reports for each."""
    runs = ([{"config": "ours", **ours}] if ours else []) + trl_rows
    lines = []
    for row in runs:
        if "failed" in row:
            lines.append({"config": row["config"], "failed": row["failed"], "peak_rss_mb": row.get("peak_rss_mb")})
            continue
        lines.append(
            {
                "config": row["config"],
                "steps": row["steps"],
                "seconds_per_step": row["seconds_per_step"],
                "seconds_per_step_mean": row["seconds_per_step_mean"],
                "first_step_clock_seconds": row["first_step_clock_seconds"],
                **{f"time_to_{level:.2f}_seconds": _first_reaching(row["evals"], level) for level in LEVELS},
                "final_accuracy": _final(row["evals"])["accuracy"] if row["evals"] else None,
                "peak_rss_mb": row["peak_rss_mb"],
            }
        )
    return lines


def plot(ours: dict[str, Any] | None, trl_rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, rew_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    curves = ([("Trinity (ours)", ours)] if ours else []) + [
        (f"TRL {r['config']}", r) for r in trl_rows if "failed" not in r
    ]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (name, data), color in zip(curves, itertools.cycle(colors), strict=False):
        evals = sorted(data["evals"], key=lambda r: r["clock_seconds"])
        acc_ax.plot(
            [r["clock_seconds"] / 60 for r in evals],
            [r["accuracy"] for r in evals],
            marker="o",
            color=color,
            label=name,
        )
        for r in evals:
            acc_ax.annotate(
                f"{r['step']}",
                (r["clock_seconds"] / 60, r["accuracy"]),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
        rewards = data["rewards"]
        rew_ax.plot(
            [r["clock_seconds"] / 60 for r in rewards],
            [r["reward_mean"] for r in rewards],
            color=color,
            label=name,
            alpha=0.8,
        )
    acc_ax.set_title("held-out sampled accuracy (labels: optimizer step)")
    acc_ax.set_xlabel("minutes since launch, evaluation time excluded")
    acc_ax.set_ylabel("accuracy (20 prompts x 8 samples, T=1.0)")
    rew_ax.set_title("training batch mean reward")
    rew_ax.set_xlabel("minutes since launch, evaluation time excluded")
    for ax in (acc_ax, rew_ax):
        ax.grid(alpha=0.3)
        if curves:  # every row failed: an empty plot, not a legend of nothing
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(
    quick: bool = False,
    ours_steps: int | None = None,
    trl_configs: tuple[str, ...] = DEFAULT_TRL_CONFIGS,
    trl_steps: int | None = None,
    skip_ours: bool = False,
    ours_overrides: tuple[str, ...] = (),
) -> dict[str, Any]:
    from benchmarks.common import write_result
    from trinity.models import resolve_model_path

    steps = trl_steps or (4 if quick else 16)
    ours_steps = ours_steps or (steps if quick else 2 * steps)
    model_path = str(resolve_model_path("smollm2"))
    workdir = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    # One after the other: each run gets the (shared) cores and memory to itself.
    ours = None if skip_ours else _run_ours(ours_steps, workdir, ours_overrides)
    trl_rows: list[dict[str, Any]] = []
    for spec in trl_configs:
        try:
            resolved = _resolve(spec, trl_rows)
        except ValueError as err:  # `fastest+...` with nothing before it that ran
            trl_rows.append({"config": spec, "failed": str(err)})
            continue
        print(f"== TRL {resolved}", flush=True)
        trl_rows.append(_run_trl(resolved, steps, workdir, model_path))
        print(json.dumps(table(None, trl_rows[-1:])[0]), flush=True)
    # A partial run (one side only, or ours with a lever changed) never replaces the full comparison's file.
    name = (
        ("e2e_quick" if quick else "e2e") + ("_trl_only" if skip_ours else "") + ("" if trl_configs else "_ours_only")
    )
    name += "_set" if ours_overrides else ""
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(ours, trl_rows, RESULTS / f"{name}.png")
    best = fastest_trl(trl_rows)
    result = {
        "quick": quick,
        "steps": {"trl": steps, "ours": None if skip_ours else ours_steps},
        "trl_configs": list(trl_configs),
        "ours_overrides": list(ours_overrides),
        "setup": {
            "model": "SmolLM2-135M-Instruct (fp32)",
            "prompts_per_step": 8,
            "group": 8,
            "max_completion_tokens": 16,
            "lr": 1e-5,
            "eval": "20 held-out prompts x 8 samples, T=1.0, at step 0 and every 4 steps",
            "clock": "seconds since subprocess launch, held-out evaluation time subtracted (see module doc)",
            # A spike shorter than the 0.2 s sampling can be missed: in a quick run TRL's ru_maxrss (exact for its
            # one process) read 1.3% above the sampled peak.
            "memory": "peak over time of the summed RSS of the launched process and all its descendants, "
            "sampled every 0.2 s",
        },
        "table": table(ours, trl_rows),
        "comparison": compare(ours, best) if ours and best else None,
        "ours": ours,
        "trl": trl_rows,
        "plot": str((RESULTS / f"{name}.png").relative_to(ROOT)),
        "workdir": str(workdir),
    }
    write_result(name, result)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 steps per side instead of 16")
    parser.add_argument("--ours-steps", type=int, default=None, help="ours' optimizer steps (default: 2x TRL's)")
    parser.add_argument("--trl-steps", type=int, default=None, help="TRL's optimizer steps (default 16, --quick 4)")
    parser.add_argument(
        "--trl-configs",
        default=",".join(DEFAULT_TRL_CONFIGS),
        help=f"comma-separated, run in this order (default: {','.join(DEFAULT_TRL_CONFIGS)}); "
        f"each one of {', '.join(TRL_CONFIGS)}, or `fastest`, optionally +genN",
    )
    parser.add_argument("--skip-ours", action="store_true", help="TRL configurations only (no comparison)")
    parser.add_argument(
        "--ours-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change one setting of ours' quickstart config (a dotted key, a YAML value; repeatable), e.g. "
        "explorer.threads=2; the result is written apart (`*_set.json`)",
    )
    parser.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="", help=argparse.SUPPRESS)
    parser.add_argument("--launched", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default="", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.trl_worker:
        trl_worker(cli.trl_configs, cli.trl_steps, cli.model, cli.launched, Path(cli.out), Path(cli.workdir))
    else:
        specs = tuple(s.strip() for s in cli.trl_configs.split(",") if s.strip())
        done = run(cli.quick, cli.ours_steps, specs, cli.trl_steps, cli.skip_ours, tuple(cli.ours_set))
        print(json.dumps({"table": done["table"], "comparison": done["comparison"]}, indent=2))
