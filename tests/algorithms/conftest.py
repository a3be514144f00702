import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    # The machine's 2 cores are shared; these tensors are tiny anyway.
    torch.set_num_threads(1)
