"""benchmarks.compare.dropout_masks: compiled dropout keeps a mask that torch's generator drew, uses the
same mask in the backward, and scales by 1 / (1 - p).

The expected values are written out here from ``torch.rand`` on a generator seeded like the
global one; inductor's own masks (per-element Philox) would not equal them, so a backend that
lost the decomposition fails, and so does one that draws the mask again for the backward.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from benchmarks.compare.dropout_masks import inductor_with_aten_masks, keep_mask
from benchmarks.compare.steps import forward_backward
from benchmarks.studies import compile_masks
from common.config import TransformerConfig
from common.random_batch import random_batch
from tests.helpers import FLOAT64_TOL
from variants import build

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


@pytest.mark.slow  # seconds: a child process, a compile or a full run; CI runs it with -m slow
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


def test_compile_masks_lists_a_steps_costliest_ops_with_their_calls():
    # the script's profile, on an eager step (its compiled kinds are what the tests above and
    # test_compiled_step.py check; compiling two more here would cost minutes of the slow suite)
    config = TransformerConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, src_vocab_size=20,
                               tgt_vocab_size=20, max_seq_len=8)
    model = build("explicit", config, seed=0).train()
    lines = compile_masks.top_ops(forward_backward(model, random_batch(config, 2, 5, 4)), 500)
    by_name = {line.split()[-1]: line.split() for line in lines}
    # explicit's 12 dropout sites at one layer, each one eager bernoulli_ draw
    assert by_name["aten::bernoulli_"][2] == "x12"
    assert float(lines[0].split()[0]) >= float(lines[-1].split()[0])  # costliest first
