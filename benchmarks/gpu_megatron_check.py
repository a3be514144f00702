"""GPU check of the Megatron backend (run by hand on a CUDA machine; never imported by tests).

    python benchmarks/gpu_megatron_check.py                 # random SmolLM2-135M-shaped Llama, bf16
    python benchmarks/gpu_megatron_check.py --model DIR     # a real HF Llama/Qwen2 directory

Megatron backend at TP=1 (NCCL, CUDA, bf16) vs the PyTorch backend on the same GPU, same batches:
steps/s and tokens/s of GRPO steps (KL + entropy terms, 2 mini-batches per step), the first step's loss
on both (same starting weights, so they should agree to bf16 precision), and an export check (the
Megatron export before training equals the checkpoint). Prints one JSON object.

The PyTorch backend has no device option yet: this script moves its policy and reference to the GPU
and moves each micro-batch there (subclass below); the loss math is untouched.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

SMOLLM2_135M = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_layers": 30,
    "num_heads": 9,
    "num_kv_heads": 3,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}


def _batches(steps: int, n: int, vocab: int, prompt: int, resp: int) -> list[list[Any]]:
    from trinity.v1 import common_pb2

    rng = random.Random(0)
    return [
        [
            common_pb2.Experience(
                id=f"s{s}-{i}",
                kind=common_pb2.EXPERIENCE_KIND_ROLLOUT,
                group_id=f"g{i // 8}",
                prompt_token_ids=[rng.randrange(3, vocab) for _ in range(prompt)],
                response_token_ids=[rng.randrange(3, vocab) for _ in range(rng.randint(resp // 2, resp))],
                reward=float(rng.random() > 0.5),
            )
            for i in range(n)
        ]
        for s in range(steps)
    ]


def _cuda_torch_backend(config: Any) -> Any:
    import torch

    from trinity.trainer.torch_backend import TorchBackend

    class CudaTorchBackend(TorchBackend):
        def __init__(self, c: Any) -> None:
            super().__init__(c)
            self.policy.to("cuda")
            if self.reference is not None and self.reference._copy is not None:
                self.reference._copy.to("cuda")

        def _token_logprobs(self, model: Any, batch: Any, with_entropy: bool | str) -> Any:
            lp, ent = super()._token_logprobs(model, batch.to("cuda"), with_entropy)
            return lp.float().cpu(), ent.float().cpu()

    torch.set_num_threads(4)
    return CudaTorchBackend(config)


def _timed(backend: Any, batches: list[list[Any]], warmup: int) -> dict[str, Any]:
    import torch

    seconds, metrics = [], []
    for batch in batches:
        torch.cuda.synchronize()
        start = time.perf_counter()
        metrics.append(backend.train_step(batch))
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    timed = seconds[warmup:]
    tokens = statistics.mean(m["tokens"] for m in metrics[warmup:])
    return {
        "steps_per_s": len(timed) / sum(timed),
        "tokens_per_s": tokens * len(timed) / sum(timed),
        "step_seconds": timed,
        "first_step_loss": metrics[0]["loss/total"],
        "first_step_grad_norm": metrics[0]["grad_norm"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="HF directory; default: a random SmolLM2-135M-shaped Llama")
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32, help="sequences per step")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--response", type=int, default=256)
    parser.add_argument("--skip-torch", action="store_true")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("this check needs a CUDA GPU")
    from safetensors.torch import load_file

    from trinity.config import RunConfig
    from trinity.models.tiny import build_tiny_llama
    from trinity.trainer.megatron import MegatronBackend

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model) if args.model else build_tiny_llama(Path(tmp) / "model", **SMOLLM2_135M)
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        trainer = {
            "mini_batch_size": args.batch // 2,
            "micro_batch_tokens": 8 * (args.prompt + args.response),
            "optimizer": {"lr": 1e-6},
        }

        def config(**backend: Any) -> RunConfig:
            return RunConfig.model_validate(
                {
                    "mode": "train",  # with placeholder offline data: a backend reads neither
                    "seed": 0,
                    "model": {"path": str(model), "dtype": "bfloat16",
                              "max_prompt_tokens": args.prompt, "max_response_tokens": args.response},
                    "algorithm": {"algorithm_type": "grpo", "kl_coef": 0.01, "entropy_coef": 0.001},
                    "buffer": {"offline_data": {"path": "unused.jsonl"}},
                    "trainer": {**trainer, **backend},
                }
            )  # fmt: skip

        batches = _batches(args.steps, args.batch, min(vocab, 49152), args.prompt, args.response)
        out: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "model": str(args.model or SMOLLM2_135M)}

        start = time.perf_counter()
        backend = MegatronBackend(config(backend="megatron", tensor_parallel_size=1, threads_per_worker=4))
        out["megatron_startup_s"] = time.perf_counter() - start
        try:
            exported = {k: v.float() for k, v in backend.named_weights()}
            hf = {k: v.float() for f in sorted(model.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
            out["export_equals_checkpoint"] = exported.keys() == hf.keys() and all(
                torch.equal(exported[k], hf[k].to(torch.bfloat16).float()) for k in hf
            )
            out["megatron_tp1"] = _timed(backend, batches, args.warmup)
        finally:
            backend.close()
        if not args.skip_torch:
            torch_backend = _cuda_torch_backend(config())
            out["torch"] = _timed(torch_backend, batches, args.warmup)
            out["speedup_megatron_over_torch"] = out["megatron_tp1"]["tokens_per_s"] / out["torch"]["tokens_per_s"]
            ref = out["torch"]["first_step_loss"]
            out["first_step_loss_rel_diff"] = abs(out["megatron_tp1"]["first_step_loss"] - ref) / max(abs(ref), 1e-12)
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
