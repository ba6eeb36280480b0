"""benchmarks.dropout_masks: compiled dropout keeps a mask that torch's generator drew, uses the
same mask in the backward, and scales by 1 / (1 - p).

The expected values are written out here from ``torch.rand`` on a generator seeded like the
global one; inductor's own masks (per-element Philox) would not equal them, so a backend that
lost the decomposition fails, and so does one that draws the mask again for the backward.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from benchmarks import compile_masks
from benchmarks.dropout_masks import inductor_with_aten_masks, keep_mask
from tests.helpers import FLOAT64_TOL

P_DROP = 0.25
SEED = 7


def dropped(x: torch.Tensor, train: bool = True) -> torch.Tensor:
    return F.dropout(x, P_DROP, train) * 2  # a neighbour for inductor to fuse the multiply into


@pytest.fixture(scope="module")
def compiled_dropout():
    # one compile for the module: a C++ build of a few kernels takes seconds on this box
    return torch.compile(dropped, backend=inductor_with_aten_masks({}))


def expected_mask(shape: tuple[int, ...]) -> torch.Tensor:
    """Dropout's keep-mask as ``torch.rand`` draws it after ``torch.manual_seed(SEED)``."""
    return torch.rand(shape, generator=torch.Generator().manual_seed(SEED)) > P_DROP


def test_forward_and_backward_use_one_mask_from_torch_rand(compiled_dropout):
    x = torch.randn(64, 48, dtype=torch.float64)
    compiled_dropout(x.clone().requires_grad_())  # compiles; the timed draw comes next
    x.requires_grad_()
    torch.manual_seed(SEED)
    y = compiled_dropout(x)
    upstream = torch.randn_like(x)
    y.backward(upstream)

    keep = expected_mask(x.shape)
    assert 0.7 < keep.double().mean() < 0.8  # about 1 - p kept: the draw is not degenerate
    torch.testing.assert_close(y, torch.where(keep, x / (1 - P_DROP), 0.0) * 2, **FLOAT64_TOL)
    torch.testing.assert_close(x.grad, torch.where(keep, upstream / (1 - P_DROP), 0.0) * 2,
                               **FLOAT64_TOL)


def test_eval_mode_is_the_identity(compiled_dropout):
    x = torch.randn(5, 6)
    torch.testing.assert_close(compiled_dropout(x, train=False), x * 2, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keep_mask_draws_in_float32_whatever_the_dtype(dtype):
    # a bfloat16 uniform draw holds 8 bits: p would round, and the mask would differ
    torch.manual_seed(SEED)
    mask = keep_mask(torch.zeros(300, 7, dtype=dtype), P_DROP)
    assert mask.dtype == torch.bool and mask.shape == (300, 7)
    assert torch.equal(mask, expected_mask((300, 7)))


@pytest.mark.slow  # two compiles of a small model
def test_compile_masks_profiles_the_suites_masks_and_inductors(capsys):
    assert compile_masks.main(["--preset", "tiny", "--steps", "1", "--top", "500", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    eager, inductor, suite = out.split("costliest ops")[1:]
    assert "fastest" in out.split("costliest ops")[0]
    # only the suite's backend draws with keep_mask; plain inductor draws in its own kernels
    assert "transformer_suite::keep_mask" in suite and "keep_mask" not in inductor + eager
    assert "aten::bernoulli_" in eager
