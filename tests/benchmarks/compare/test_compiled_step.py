"""benchmarks.compare.steps.compiled: the compiled train step computes what the eager one does."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.compare.dropout_masks import KEEP_MASK_OP
from benchmarks.compare.steps import CompiledModel, compiled, forward_backward, forward_step
from common.config import TransformerConfig
from common.random_batch import random_batch
from tests.helpers import FLOAT64_TOL
from variants import build

aten = torch.ops.aten

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


class QueuedMasks(TorchDispatchMode):
    """Eager dropout's draw on CPU (``bernoulli_(1 - p)`` into a fresh tensor) takes the next
    mask of its shape from ``masks``."""

    def __init__(self, masks: list[Tensor]) -> None:
        super().__init__()
        self.queues = defaultdict(list)
        for mask in masks:
            self.queues[mask.shape].append(mask)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is aten.bernoulli_.float:
            target, _ = args
            return target.copy_(self.queues[target.shape].pop(0))
        return func(*args, **(kwargs or {}))


@pytest.mark.slow  # compiling takes tens of seconds on a busy 2-core box
@pytest.mark.parametrize("variant", ["explicit", "fused"])
def test_with_dropout_the_compiled_step_is_eager_with_torch_rand_masks(variant):
    """float64, dropout 0.25. The compiled step draws each site's mask with ``torch.rand(shape)
    > p`` (benchmarks.compare.dropout_masks), but not in the forward's order: inductor may run the
    decoder's first sublayer before the encoder. So the draw order (shapes only) is read from
    the profiler, the masks are drawn here in that order from a generator seeded like the global
    one, and the eager step gets them site by site, in its own order within each shape."""
    config = CONFIG.replace(dropout=0.25)
    batch = random_batch(config, 2, 6, 5)  # S != T and d_ff != d_model: the sites' shapes differ
    eager = build(variant, config, seed=0).double().train()
    model = build(variant, config, seed=0).double().train()
    fast = compiled(model, freeze=False)
    forward_backward(fast, batch)()  # compiles; the compared step comes next
    torch.manual_seed(1)
    with torch.profiler.profile(record_shapes=True) as profile:
        forward_backward(fast, batch)()
    shapes = [e.input_shapes[0] for e in profile.events() if e.name == KEEP_MASK_OP]
    # one draw per dropout site: encoder 5 (embedding, attention weights, two sublayer outputs,
    # the feed-forward's inner activation), decoder 7 (and cross-attention's weights and output)
    assert len(shapes) == 12
    generator = torch.Generator().manual_seed(1)
    masks = [torch.rand(shape, generator=generator) > config.dropout for shape in shapes]
    with QueuedMasks(masks) as queued:
        forward_backward(eager, batch)()
    assert not any(queued.queues.values())  # every mask used
    for (name, want), got in zip(eager.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, **FLOAT64_TOL, msg=name)
