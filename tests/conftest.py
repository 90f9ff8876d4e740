"""Shared fixtures."""

import pytest
import torch


@pytest.fixture
def single_thread():
    """Run a test on one intra-op thread, then restore the previous count.

    The model tests use tensors of a few kilobytes: with two threads on a shared 2-core machine
    the thread hand-offs cost more than the arithmetic (150 overfitting steps: ~0.7 s on one
    thread, up to ~20 s on two under load).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
