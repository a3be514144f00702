"""AdamW and the learning-rate schedules (constant, linear warmup, warmup + cosine decay).

A schedule is built from the `trainer.optimizer` section and the run's length (`buffer.total_steps`,
where cosine reaches its floor) and maps the 0-based update count to a factor of `lr`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from trinity.config import OptimizerSection
from trinity.registry import Registry

Schedule = Callable[[int], float]
ScheduleFactory = Callable[[OptimizerSection, int], Schedule]
SCHEDULES: Registry[ScheduleFactory] = Registry("lr_schedule")
register_schedule = SCHEDULES.register


def _warmup_factor(step: int, warmup: int) -> float:
    # Update k (0-based) runs at (k+1)/warmup of the peak, so the first update is not wasted at lr 0.
    return min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


@register_schedule("constant")
def constant(opt: OptimizerSection, total_steps: int) -> Schedule:
    return lambda step: 1.0


@register_schedule("warmup")
def warmup(opt: OptimizerSection, total_steps: int) -> Schedule:
    return lambda step: _warmup_factor(step, opt.warmup_steps)


@register_schedule("cosine")
def cosine(opt: OptimizerSection, total_steps: int) -> Schedule:
    def factor(step: int) -> float:
        if step < opt.warmup_steps:
            return _warmup_factor(step, opt.warmup_steps)
        progress = min(1.0, (step - opt.warmup_steps) / max(1, total_steps - opt.warmup_steps))
        return opt.min_lr_ratio + (1 - opt.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def build_optimizer(
    param_groups: Iterable[dict], opt: OptimizerSection, total_steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `param_groups` (each may set its own `lr`) and a per-update LambdaLR schedule."""
    # fused: one kernel over all tensors (CPU and CUDA); 5x faster than the per-tensor loop that is the
    # CPU default (0.08 s vs 0.38 s for SmolLM2's 135M parameters on 2 cores).
    optimizer = torch.optim.AdamW(
        list(param_groups), lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay, fused=True
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, SCHEDULES.get(opt.schedule)(opt, total_steps))
    return optimizer, scheduler
