"""How the suite compiles: inductor, with dropout's keep-masks drawn by aten instead of inductor.

    model = torch.compile(model, backend=inductor_with_aten_masks({}))

On CPU, inductor draws a dropout mask inside its own fused kernels with one Philox engine per
element, which costs more per entry than ``torch.rand`` and a comparison; in the base model's
train step the masks' extra cost was more than all that fusion saved, and the compiled step ran
slower than eager (the numbers are in docs/benchmarks.md, compiled training). This backend is
inductor with one decomposition changed: on CPU, ``aten.native_dropout`` becomes ``keep_mask``
(an op inductor cannot see into, so aten's generator fills the mask) and the same multiply as
torch's own decomposition, which inductor still fuses into the kernels around it. The mask is
saved for the backward, never drawn again. Other devices keep inductor's masks: on CUDA they are
generated in the fused kernels at memory speed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

aten = torch.ops.aten
KEEP_MASK_OP = "transformer_suite::keep_mask"  # the name the profiler and the graphs show


# nondeterministic_seeded: the partitioner must keep its output for the backward, never
# recompute it (a second draw would be another mask)
@torch.library.custom_op(KEEP_MASK_OP, mutates_args=(),
                         tags=(torch.Tag.nondeterministic_seeded,))
def keep_mask(x: Tensor, p: float) -> Tensor:
    """True with probability 1 - p, shaped like ``x``: uniform draws from torch's generator,
    in float32 whatever ``x``'s dtype (a bfloat16 draw would round p to 8 bits)."""
    return torch.rand(x.shape, device=x.device) > p


@keep_mask.register_fake
def _keep_mask_shape(x: Tensor, p: float) -> Tensor:
    return x.new_empty(x.shape, dtype=torch.bool)


def native_dropout(default: Callable, x: Tensor, p: float, train: bool | None) -> tuple[Tensor, Tensor]:
    """``aten.native_dropout`` as torch's decomposition (``default``) writes it, with the mask
    from ``keep_mask`` on CPU."""
    if not train or not 0 < p < 1 or x.device.type != "cpu":
        return default(x, p, train)
    mask = keep_mask(x, p)
    return mask * x * (1.0 / (1.0 - p)), mask


def inductor_with_aten_masks(options: dict) -> Callable:
    """A ``torch.compile`` backend: inductor with ``options`` (its config names, as
    ``torch.compile(options=...)`` takes them) and dropout's masks from ``keep_mask``."""

    def backend(graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
        # inductor is imported at the first compile, not with compare.py's engine: importing it
        # takes about 2 s, which every fresh process of a run would pay without compiling
        from torch._inductor.compile_fx import compile_fx
        from torch._inductor.decomposition import select_decomp_table

        table = select_decomp_table()
        default = table[aten.native_dropout.default]
        decompositions = {**table, aten.native_dropout.default: partial(native_dropout, default)}
        # AOTAutograd's cache key leaves custom decompositions out: without this, a graph that
        # a plain torch.compile cached would come back with inductor's own masks
        with torch._functorch.config.patch(enable_autograd_cache=False):
            return compile_fx(graph, example_inputs, config_patches=options,
                              decompositions=decompositions)

    return backend
