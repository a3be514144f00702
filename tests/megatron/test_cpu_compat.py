"""The CPU compatibility layer is pinned: a megatron-core that changed what it needs fails here first."""

from __future__ import annotations

import importlib
import inspect
import re

import pytest
import torch

from trinity.trainer.megatron import cpu_compat


def test_installed_megatron_core_is_the_tested_version() -> None:
    assert cpu_compat.megatron_version() == cpu_compat.TESTED_MEGATRON_VERSION


@pytest.mark.parametrize(("module", "attribute"), cpu_compat.PATCHED_ATTRIBUTES)
def test_every_patched_attribute_still_exists(module: str, attribute: str) -> None:
    assert hasattr(importlib.import_module(module), attribute), f"{module}.{attribute} is gone"


@pytest.mark.parametrize(("module", "attribute"), cpu_compat.CUDA_LITERAL_SITES)
def test_cuda_literal_sites_still_create_cuda_tensors(module: str, attribute: str) -> None:
    # If a site stops hard-coding "cuda", the device-rewriting mode may no longer be needed there.
    source = inspect.getsource(getattr(importlib.import_module(module), attribute))
    assert 'device="cuda"' in source or "device='cuda'" in source


def test_rng_tracker_add_still_uses_the_cuda_generator() -> None:
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    assert "torch.cuda.manual_seed" in inspect.getsource(CudaRNGStatesTracker.add)


def test_apply_refuses_an_untested_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_compat, "megatron_version", lambda: "0.17.0")
    monkeypatch.setattr(cpu_compat, "_applied", False)
    with pytest.raises(RuntimeError, match=re.escape("tested with megatron-core==0.16.1")):
        cpu_compat.apply()


def test_mode_moves_cuda_creations_to_cpu_and_reports_cuda_type_names() -> None:
    with cpu_compat.CudaToCpuMode():
        t = torch.zeros(3, device="cuda")
        u = torch.ones(2, dtype=torch.bfloat16).cuda()
        name = t.type()
    assert t.device.type == "cpu" and u.device.type == "cpu"
    assert name == "torch.cuda.FloatTensor"
    assert torch.zeros(1).type() == "torch.FloatTensor"  # outside the mode nothing changes
