"""Tokens/s of one GRPO step through the Trainer backend vs a plain Hugging Face loop on the same batch.

    python benchmarks/bench_trainer.py            # SmolLM2-135M (converted from the shipped GGUF once)
    python benchmarks/bench_trainer.py --quick    # tiny random model, seconds

Both sides do the same work per step: forward + backward of the policy-gradient loss over the batch and
one AdamW update (no reference model: KL weight 0). Writes benchmarks/results/trainer.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "trainer.json"


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _experiences(n_prompts: int, group: int, prompt_len: int, resp_len: int, vocab: int) -> list[Any]:
    import torch

    from trinity.v1 import common_pb2

    g = torch.Generator().manual_seed(0)
    out = []
    for p in range(n_prompts):
        prompt = torch.randint(10, vocab, (prompt_len,), generator=g).tolist()
        for k in range(group):
            n = resp_len - int(torch.randint(0, resp_len // 4 + 1, (1,), generator=g))
            out.append(
                common_pb2.Experience(
                    id=f"p{p}-{k}",
                    kind=common_pb2.EXPERIENCE_KIND_ROLLOUT,
                    group_id=f"p{p}",
                    prompt_token_ids=prompt,
                    response_token_ids=torch.randint(10, vocab, (n,), generator=g).tolist(),
                    logprobs=[-3.0] * n,
                    reward=float(torch.rand((), generator=g) > 0.5),
                )
            )
    return out


def _plain_hf_step(model: Any, optimizer: Any, exps: list[Any], pad_id: int) -> int:
    """The textbook loop: full-vocab logits, log_softmax, REINFORCE-with-group-baseline, one AdamW step."""
    import torch

    seqs = [list(e.prompt_token_ids) + list(e.response_token_ids) for e in exps]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id)
    attn = torch.zeros_like(ids)
    loss_mask = torch.zeros((len(seqs), width - 1))
    for i, (s, e) in enumerate(zip(seqs, exps, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        loss_mask[i, len(e.prompt_token_ids) - 1 : len(s) - 1] = 1
    rewards = torch.tensor([e.reward for e in exps])
    groups = [e.group_id for e in exps]
    adv = torch.stack(
        [rewards[i] - rewards[[j for j, g in enumerate(groups) if g == groups[i]]].mean() for i in range(len(exps))]
    )
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    loss = -(logp * adv[:, None] * loss_mask).sum() / loss_mask.sum()
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return int(attn.sum())


def run(quick: bool = False) -> dict[str, Any]:
    import torch

    from trinity.config import RunConfig
    from trinity.models.gguf import ensure_smollm2
    from trinity.models.tiny import build_tiny_llama
    from trinity.trainer.torch_backend import TorchBackend

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    tmp = tempfile.mkdtemp(prefix="bench-trainer-")
    if quick:
        model_path = build_tiny_llama(Path(tmp) / "tiny", vocab_size=512, hidden_size=128, num_layers=4)
        shape = {"n_prompts": 4, "group": 4, "prompt_len": 32, "resp_len": 64}
    else:
        cache = Path(os.environ.get("TRINITY_MODEL_CACHE", Path.home() / ".cache" / "trinity" / "models"))
        model_path = ensure_smollm2(cache)
        shape = {"n_prompts": 8, "group": 4, "prompt_len": 48, "resp_len": 96}
    steps = 2
    config = RunConfig.model_validate(
        {
            "mode": "train",  # with placeholder offline data: the backend reads neither
            "seed": 0,
            "model": {"path": str(model_path)},
            "algorithm": {"algorithm_type": "grpo", "kl_coef": 0.0},
            "buffer": {"offline_data": {"path": "unused.jsonl"}},
            "trainer": {"optimizer": {"lr": 1e-6}, "micro_batch_tokens": 4096},
        }
    )
    backend = TorchBackend(config)
    vocab = int(backend.hf_tokenizer.vocab_size)
    batches = [_experiences(**shape, vocab=min(vocab, 49152)) for _ in range(steps + 1)]
    for i, b in enumerate(batches):
        for e in b:
            e.id = f"{i}-{e.id}"

    backend.train_step(batches[0])  # warm-up (allocator, first-call overheads)
    trainer_tps = []
    for b in batches[1:]:
        trainer_tps.append(backend.train_step(b)["tokens_per_s"])
    rss_trainer = _peak_rss_mb()
    del backend

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    pad_id = int(model.config.pad_token_id or 0)
    _plain_hf_step(model, optimizer, batches[0], pad_id)
    hf_tps = []
    for b in batches[1:]:
        start = time.perf_counter()
        tokens = _plain_hf_step(model, optimizer, b, pad_id)
        hf_tps.append(tokens / (time.perf_counter() - start))

    result = {
        "model": "tiny-llama" if quick else "SmolLM2-135M-Instruct (fp32)",
        "batch": {**shape, "experiences": shape["n_prompts"] * shape["group"]},
        "threads": torch.get_num_threads(),
        "trainer_tokens_per_s": statistics.median(trainer_tps),
        "plain_hf_tokens_per_s": statistics.median(hf_tps),
        "ratio_trainer_over_hf": statistics.median(trainer_tps) / statistics.median(hf_tps),
        "peak_rss_mb_after_trainer": rss_trainer,
        "peak_rss_mb_after_hf": _peak_rss_mb(),
        "quick": quick,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny random model instead of SmolLM2-135M")
    print(json.dumps(run(parser.parse_args().quick), indent=2))
