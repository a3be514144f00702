"""Which reasoning-gym generators suit a small model: its greedy and sampled accuracy on each candidate.

    python -m benchmarks.reasoning_gym_difficulty [--model smollm2] [--prompts 64] [--samples 4]
        [--system-prompt direct] [--only basic_arithmetic,leg_counting] [--out benchmarks/results/...json]

A candidate is a generator with an easy config. Its `--prompts` rows come from the buffer's own generation
(`trinity.buffer.tasksets.reasoning_gym.make_rows`, seed 1), asked through the model's chat template after one of
reasoning-gym's system prompts (`reasoning_gym.utils.SYSTEM_PROMPTS`: they ask for `<answer>...</answer>`) and
`--shots` worked examples of the same generator (seed 100000: user question, assistant `<answer>answer</answer>`;
a 135M model ignores the system prompt's format without them); the responses are scored by the explorer's
registered `reasoning_gym` reward, as a run scores them. Each row is answered
once greedily and `--samples` times at temperature 1.0, on the repository's vLLM engine. Accuracy is the share of
answers scored 1 (a run's eval `accuracy`); `mean` is the mean score (partial credit counts). A generator whose
sampled accuracy lies between 0.1 and 0.4 leaves an RL run room to learn and signal to learn from.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

# Easy configs of plausible generators for a 135M model.
CANDIDATES: list[tuple[str, dict[str, Any]]] = [
    ("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
    (
        "basic_arithmetic",
        {"min_terms": 2, "max_terms": 2, "max_digits": 1, "operators": ["+", "-"], "allow_negation": False},
    ),
    ("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}),
    ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
    ("leg_counting", {"min_animals": 1, "max_animals": 2, "max_instances": 3}),
    ("number_sorting", {"min_numbers": 3, "max_numbers": 3, "min_decimals": 0, "max_decimals": 0}),
    ("letter_counting", {"min_words": 3, "max_words": 5}),
    ("count_bits", {"max_n": 64}),
    ("word_sorting", {"min_words": 3, "max_words": 3}),
    ("simple_equations", {"min_terms": 2, "max_terms": 2, "max_value": 10}),
    ("spell_backward", {"min_word_len": 3, "max_word_len": 4}),
    ("gcd", {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 20}),
    ("word_sequence_reversal", {"min_words": 3, "max_words": 3}),
    ("products", {"min_digits": 1, "max_digits": 1}),
    ("lcm", {"min_value": 1, "max_value": 10}),
    ("prime_factorization", {"min_value": 2, "max_value": 20}),
    ("gsm_symbolic", {}),
]


def tasks_of(name: str, config: dict[str, Any], size: int, seed: int = 1) -> list[Any]:
    """`size` tasks of one generator, made and shaped as the buffer makes and hands them out."""
    from google.protobuf import struct_pb2

    from trinity.buffer.tasksets.reasoning_gym import make_rows
    from trinity.config.buffer import ReasoningGymConfig
    from trinity.v1 import common_pb2

    rows = make_rows(ReasoningGymConfig(size=size, seed=seed, generators=({"name": name, "config": config},)))
    tasks = []
    for index, row in enumerate(rows):
        payload = struct_pb2.Struct()
        payload.update(row)
        tasks.append(
            common_pb2.Task(id=f"{name}/{index}", prompt=row["question"], answer=str(row["answer"]), payload=payload)
        )
    return tasks


def chat(system_prompt: str, examples: list[Any], question: str) -> list[dict[str, str]]:
    """System prompt, the worked examples as user / assistant turns, then the question."""
    messages = [{"role": "system", "content": system_prompt}]
    for example in examples:
        messages += [
            {"role": "user", "content": example.prompt},
            {"role": "assistant", "content": f"<answer>{example.answer}</answer>"},
        ]
    return [*messages, {"role": "user", "content": question}]


def measure(
    engine: Any, tasks: list[Any], examples: list[Any], system_prompt: str, samples: int, max_tokens: int
) -> dict[str, Any]:
    from trinity.explorer.engines.base import GenerationRequest, SamplingSettings
    from trinity.explorer.rewards import evaluate_reward, get_reward

    reward = get_reward("reasoning_gym")

    def scores(temperature: float, n: int) -> tuple[list[float], list[str]]:
        sampling = SamplingSettings(temperature=temperature, max_tokens=max_tokens)
        requests = [
            GenerationRequest(messages=chat(system_prompt, examples, t.prompt), n=n, sampling=sampling) for t in tasks
        ]
        results = engine.generate(requests)
        out, texts = [], []
        for task, result in zip(tasks, results, strict=True):
            for sample in result.samples:
                outcome = evaluate_reward(reward, sample.text, task)
                out.append(0.0 if outcome.failed else outcome.reward)
                texts.append(sample.text)
        return out, texts

    greedy, greedy_texts = scores(0.0, 1)
    sampled, _ = scores(1.0, samples)

    def summary(values: list[float]) -> dict[str, float]:
        return {"accuracy": sum(v >= 1.0 for v in values) / len(values), "mean": sum(values) / len(values)}

    return {
        "greedy": summary(greedy),
        "sampled": summary(sampled),
        "n_prompts": len(tasks),
        "n_sampled": len(sampled),
        "example": {"question": tasks[0].prompt, "answer": tasks[0].answer, "greedy": greedy_texts[0]},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="a model directory, or smollm2 (SmolLM2-135M-Instruct)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4, help="sampled answers per prompt (temperature 1.0)")
    parser.add_argument("--shots", type=int, default=2, help="worked examples before each question")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--system-prompt", default="direct", help="a key of reasoning_gym.utils.SYSTEM_PROMPTS")
    parser.add_argument("--only", default="", help="comma-separated generator names (default: every candidate)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/reasoning_gym_difficulty.json"))
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

    from reasoning_gym.utils import SYSTEM_PROMPTS

    from trinity.explorer.engines import create_engine
    from trinity.models import resolve_model_path

    wanted = set(filter(None, args.only.split(",")))
    candidates = [(n, c) for n, c in CANDIDATES if not wanted or n in wanted]
    engine = create_engine("vllm", model_path=resolve_model_path(args.model), seed=0)
    report: dict[str, Any] = {
        "model": args.model,
        "system_prompt": args.system_prompt,
        "shots": args.shots,
        "max_tokens": args.max_tokens,
        "samples": args.samples,
        "rows": [],
    }
    try:
        for name, config in candidates:
            started = time.time()
            row = {"generator": name, "config": config}
            tasks = tasks_of(name, config, args.prompts)
            examples = tasks_of(name, config, args.shots, seed=100_000) if args.shots else []
            prompt = SYSTEM_PROMPTS[args.system_prompt]
            row.update(measure(engine, tasks, examples, prompt, args.samples, args.max_tokens))
            row["seconds"] = round(time.time() - started, 1)
            report["rows"].append(row)
            print(json.dumps({k: row[k] for k in ("generator", "config", "greedy", "sampled", "seconds")}), flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=1) + "\n")
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
