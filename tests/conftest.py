"""Fixtures shared by every test module."""

from __future__ import annotations

import pytest
import torch

from common.bfloat16 import Bfloat16Support
from variants import FROM_SCRATCH, VARIANTS

EMULATED = Bfloat16Support(False, "the test suite's float32")


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Test models are tiny: threads only add overhead (and thrash on a shared machine), and one
    thread fixes the order of floating-point reductions, so runs repeat exactly."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="session")
def float32_training():
    """Translation trains under bfloat16 autocast by default on a CPU that multiplies it
    natively; the suite's runs stay float32 on every CPU, so that no verdict depends on the
    machine's flags (session-wide: module fixtures train too). The tests of that choice set the
    answer they need."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("seq2seq.options.bfloat16_support", lambda device="cpu": EMULATED)
        yield


@pytest.fixture(params=VARIANTS)
def variant(request) -> str:
    """Each registered variant in turn: a new variant joins every test that takes this fixture."""
    return request.param


@pytest.fixture(params=FROM_SCRATCH)
def subject_variant(request) -> str:
    """Each registered variant but the reference (``variants.REFERENCE``), for tests whose
    expected value is the reference's own output: the reference is not compared with itself."""
    return request.param


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests need CUDA; skip them (visibly) where there is none."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
