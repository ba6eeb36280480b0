"""benchmarks.steps.compiled: the compiled train step computes what the eager one does."""

from __future__ import annotations

import pytest
import torch

from benchmarks.steps import CompiledModel, compiled, forward_backward, forward_step
from common.batches import random_batch
from common.config import TransformerConfig
from variants import build

# dropout 0: the compiled step draws its masks in another order, so only then are they equal
CONFIG = TransformerConfig(d_model=32, n_heads=4, n_layers=1, d_ff=64, src_vocab_size=40,
                           tgt_vocab_size=40, max_seq_len=16, dropout=0.0)


@pytest.mark.slow  # compiling takes tens of seconds on a busy 2-core box
@pytest.mark.parametrize("variant", ["explicit", "fused"])
def test_the_compiled_step_has_the_eager_gradients_and_log_probs(variant):
    batch = random_batch(CONFIG, 2, 6, 5)
    eager, model = build(variant, CONFIG, seed=0), build(variant, CONFIG, seed=0)
    fast = compiled(model, freeze=False)
    assert isinstance(fast, CompiledModel)
    assert list(fast.parameters()) == list(model.parameters())  # no copy of the weights
    eager.train(), model.train()
    forward_backward(eager, batch)()
    forward_backward(fast, batch)()
    for (name, want), got in zip(eager.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, msg=name)
    eager.eval(), model.eval()
    torch.testing.assert_close(forward_step(fast, batch)(), forward_step(eager, batch)())
