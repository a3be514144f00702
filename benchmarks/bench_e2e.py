"""End to end against TRL's `GRPOTrainer`: seconds per step and held-out accuracy against wall time.

    python -m benchmarks.bench_e2e            # TRL 16 steps, ours 32 (tens of minutes on 2 shared cores)
    python -m benchmarks.bench_e2e --fast     # ours with bf16 matmuls and one-step-off sampling
    python -m benchmarks.bench_e2e --quick    # 4 steps each (a smoke run, still minutes: the real model)

Both sides train SmolLM2-135M-Instruct with GRPO on the quickstart additions (examples/quickstart): 8 prompts x 8
samples per optimizer step, 16 completion tokens, temperature 1.0, lr 1e-5 constant, AdamW (weight decay 0.01,
grad-norm clip 1.0), no KL term, token-mean loss, the same `accuracy` reward (last number equals the answer), and
the same chat template. Held-out accuracy: 20 unseen additions x 8 samples at temperature 1.0 at the start and
every 4 optimizer steps.

Ours is `trinity run` in a subprocess (Redis + gateway + buffer + trainer + a vLLM explorer). TRL runs in a
subprocess of its own (`--trl-worker`): HF `generate` for rollouts, fp32 on CPU, 2 torch threads.

Clock accounting (the same rule for both): time starts when the subprocess is launched, so it includes imports,
model loading and service start-up, and the time spent on held-out evaluation is taken out.
- TRL: the evaluation runs in a callback between optimizer steps; its duration is measured and subtracted.
- Ours: the explorer times each evaluation and reports it with the result; that duration is subtracted. The
  explorer evaluates after putting a batch, so training may run meanwhile: both then share the cores, and
  the slower training that results stays on our clock. The raw clock (eval included) is kept too.

The question is "how soon does ours reach the held-out accuracy TRL ends with", so ours runs more optimizer
steps than TRL (`--ours-steps`, default twice as many): that lets the curve show when it gets there, and what it
reaches within TRL's wall time. Every other setting is the same on both sides.

Writes benchmarks/results/e2e.json and e2e.png (`e2e_quick.*` with --quick, so a smoke run keeps the full result).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


# `--fast`: ours with the speed switches the quickstart leaves off: bf16 matmuls over fp32 master weights in the
# trainer, bf16 sampling in vLLM (2x faster generation; its log-probs then differ from the trainer's by ~0.04, which
# the PPO ratio absorbs), and one-step-off sampling, so generation overlaps training. TRL runs as always (its CPU
# default, fp32).
FAST = {
    "trainer": {"autocast": "bfloat16"},
    "explorer": {"engine_options": {"dtype": "bfloat16"}},
    "synchronizer": {"sync_offset": 1, "max_staleness": 1},
}


def _run_ours(steps: int, workdir: Path, fast: bool = False) -> dict[str, Any]:
    import yaml

    config = _quickstart_config()
    if fast:
        for section, values in FAST.items():
            config.setdefault(section, {}).update(values)
    config["name"] = "bench-e2e"
    config["buffer"]["total_steps"] = steps
    for section in [config["buffer"]["taskset"], *config["buffer"]["eval_tasksets"]]:
        section["path"] = str((QUICKSTART / section["path"]).resolve())  # the config moves to workdir
    config["monitor"]["tensorboard"] = False
    config_path = workdir / "ours.yaml"
    config_path.write_text(yaml.safe_dump(config))
    output = workdir / "ours"
    launched = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(config_path), "--output", str(output), "--quiet"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    summary_path = output / "summary.json"
    if proc.returncode != 0 or not summary_path.exists():
        raise RuntimeError(f"trinity run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    summary = json.loads(summary_path.read_text())
    return _ours_from_summary(summary, launched, steps)


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


def _run_trl(steps: int, workdir: Path, model_path: str) -> dict[str, Any]:
    out = workdir / "trl.json"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(THREADS),
        "OMP_WAIT_POLICY": "PASSIVE",
        "TOKENIZERS_PARALLELISM": "false",
    }
    launched = time.time()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench_e2e",
            "--trl-worker",
            "--steps",
            str(steps),
            "--model",
            model_path,
            "--launched",
            repr(launched),
            "--out",
            str(out),
            "--workdir",
            str(workdir / "trl"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"TRL worker failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    return json.loads(out.read_text())


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


def trl_worker(steps: int, model_path: str, launched: float, out: Path, workdir: Path) -> None:
    """One TRL GRPO run with the quickstart's settings; writes its step times, rewards and eval curve to `out`."""
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

    def accuracy(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [_score(t, a) for t, a in zip(texts, answer, strict=True)]

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    args = GRPOConfig(
        output_dir=str(workdir),
        use_cpu=True,
        bf16=False,
        max_steps=steps,
        per_device_train_batch_size=prompts_per_step * group,  # completions: one generation batch per step
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
        use_vllm=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=int(qs["seed"]),
        dataloader_num_workers=0,
    )
    record: dict[str, Any] = {"evals": [], "step_seconds": [], "rewards": []}
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

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.began = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            record["step_seconds"].append(time.perf_counter() - self.began)
            record.setdefault("step_clock", []).append(clock())
            if state.global_step % EVAL_INTERVAL == 0 or state.global_step == steps:
                evaluate(state.global_step, kw["model"])

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "reward" in logs:
                record["rewards"].append(
                    {"step": state.global_step, "reward_mean": float(logs["reward"]), "clock_seconds": clock()}
                )

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
            "system": f"TRL GRPOTrainer (HF generate, fp32 CPU, {THREADS} threads)",
            "steps": len(record["step_seconds"]),
            "requested_steps": steps,
            "seconds_per_step": statistics.median(gaps) if gaps else statistics.median(record["step_seconds"]),
            "step_seconds_median": statistics.median(record["step_seconds"]),
            "first_step_clock_seconds": step_clock[0] if step_clock else None,
            "total_clock_seconds": step_clock[-1] if step_clock else None,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    )
    out.write_text(json.dumps(record, indent=2))


# ---- comparison ------------------------------------------------------------------------------------------------


def _first_reaching(evals: list[dict[str, Any]], target: float, key: str = "clock_seconds") -> float | None:
    for row in sorted(evals, key=lambda r: r[key]):
        if row["accuracy"] >= target - 1e-9:
            return float(row[key])
    return None


def compare(ours: dict[str, Any], trl: dict[str, Any]) -> dict[str, Any]:
    """Time for ours to reach TRL's final held-out accuracy, against TRL's total time.

    `speedup_*` is TRL's time over ours (above 1: ours is sooner); None when ours never reached it.
    The `_eval_included` variant keeps ours' in-line evaluations on its clock (TRL's stay excluded): a bound
    that cannot flatter ours, since part of our evaluation overlaps training.
    """
    final = max(trl["evals"], key=lambda r: r["step"])
    trl_total = float(final["clock_seconds"])
    ours_time = _first_reaching(ours["evals"], final["accuracy"])
    ours_raw = _first_reaching(ours["evals"], final["accuracy"], key="raw_seconds")
    return {
        "trl_final_accuracy": final["accuracy"],
        "trl_time_to_final_seconds": trl_total,
        "trl_first_reached_final_seconds": _first_reaching(trl["evals"], final["accuracy"]),
        "ours_final_accuracy": max(ours["evals"], key=lambda r: r["step"])["accuracy"] if ours["evals"] else None,
        "ours_time_to_trl_final_seconds": ours_time,
        "ours_accuracy_within_trl_total_time": max(
            (r for r in ours["evals"] if r["clock_seconds"] <= trl_total), key=lambda r: r["clock_seconds"]
        )["accuracy"],
        "ours_time_to_trl_final_seconds_eval_included": ours_raw,
        "speedup_to_trl_final_accuracy": trl_total / ours_time if ours_time else None,
        "speedup_to_trl_final_accuracy_eval_included": trl_total / ours_raw if ours_raw else None,
        "seconds_per_step_ours": ours["seconds_per_step"],
        "seconds_per_step_trl": trl["seconds_per_step"],
        "seconds_per_step_ratio_trl_over_ours": trl["seconds_per_step"] / ours["seconds_per_step"],
        # Final accuracies sit within sampling noise of each other (160 samples: about +-0.03), so also the
        # time each side first reached a few fixed levels, and TRL's time over ours for each.
        "time_to_accuracy_seconds": {
            f"{level:.2f}": {
                "ours": (o := _first_reaching(ours["evals"], level)),
                "trl": (t := _first_reaching(trl["evals"], level)),
                "speedup": t / o if o and t else None,
            }
            for level in (0.5, 0.75, 0.9)
        },
        "target_speedup": 3.0,
    }


def plot(ours: dict[str, Any], trl: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, rew_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for name, data, color in (("Trinity (ours)", ours, "tab:blue"), ("TRL GRPOTrainer", trl, "tab:orange")):
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
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(quick: bool = False, fast: bool = False, ours_steps: int | None = None) -> dict[str, Any]:
    from benchmarks.common import write_result
    from trinity.models import resolve_model_path

    steps = 4 if quick else 16
    ours_steps = ours_steps or (steps if quick else 2 * steps)
    model_path = str(resolve_model_path("smollm2"))
    workdir = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    # One after the other: each side gets the (shared) cores and memory to itself.
    ours = _run_ours(ours_steps, workdir, fast)
    trl = _run_trl(steps, workdir, model_path)
    name = ("e2e_quick" if quick else "e2e") + ("_fast" if fast else "")
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(ours, trl, RESULTS / f"{name}.png")
    result = {
        "quick": quick,
        "fast": fast,
        "ours_overrides": FAST if fast else {},
        "steps": {"trl": steps, "ours": ours_steps},
        "setup": {
            "model": "SmolLM2-135M-Instruct (fp32)",
            "prompts_per_step": 8,
            "group": 8,
            "max_completion_tokens": 16,
            "lr": 1e-5,
            "eval": "20 held-out prompts x 8 samples, T=1.0, at step 0 and every 4 steps",
            "clock": "seconds since subprocess launch, held-out evaluation time subtracted (see module doc)",
        },
        "comparison": compare(ours, trl),
        "ours": ours,
        "trl": trl,
        "plot": str((RESULTS / f"{name}.png").relative_to(ROOT)),
        "workdir": str(workdir),
    }
    write_result(name, result)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 steps per side instead of 16")
    parser.add_argument("--fast", action="store_true", help="ours with bf16 autocast and one-step-off sampling")
    parser.add_argument("--ours-steps", type=int, default=None, help="ours' optimizer steps (default: 2x TRL's)")
    parser.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=16, help=argparse.SUPPRESS)
    parser.add_argument("--model", default="", help=argparse.SUPPRESS)
    parser.add_argument("--launched", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default="", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.trl_worker:
        trl_worker(cli.steps, cli.model, cli.launched, Path(cli.out), Path(cli.workdir))
    else:
        print(json.dumps(run(cli.quick, cli.fast, cli.ours_steps)["comparison"], indent=2))
