"""Where each row's weights lie in memory, drawn anew before every round.

    placement = Placement(seed=0)
    placement.replace([explicit, torch_model])   # fresh storage for each, behind a random gap

A model's parameters land wherever the allocator put them when it was built, and stay there for
the life of the process: two copies of one model in one process can run steadily apart (which
of their pages are huge pages, which cache sets their rows map to, what they share pages
with), in every round alike, so a ratio paired by round cannot see it and its interval leaves
it out. Re-placing every row's parameters and buffers before each round makes the placement
one more thing that varies from round to round, inside the interval, as it would between
fresh processes. The model computes the same function: every tensor is copied bit for bit.

The gap is a spacer of random size (0 to ``SPACER_BYTES``, a multiple of ``SPACER_STEP``)
allocated before each row's new tensors and freed once the round's rows are all placed, so
that every row's weights start at a new offset from the heap's pages and from each other;
the rows are placed in the round's shuffled order. Each row's new tensors are allocated while
its old ones are alive, so none reuses its own previous address, and the old ones are freed
when the row is done. With compare.py's allocator policy (``memory.keep_freed_memory``: no
mmap) every allocation comes from the heap, where a spacer moves what follows it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

SPACER_BYTES = 2**21  # the spacers' sizes span one 2 MiB (transparent) huge page...
SPACER_STEP = 64  # ...in steps of a cache line, the alignment torch's CPU allocator keeps
PLACEMENT_STREAM = 0x9E3779B9  # keeps the spacers' random stream apart from the orders' (same seed)


class Placement:
    """Re-places models' tensors; its spacers' sizes come from ``seed``, so a run repeats."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.Generator(np.random.PCG64([seed, PLACEMENT_STREAM]))

    def replace(self, models: Iterable[nn.Module | None], device: str = "cpu") -> None:
        """Fresh storage for every parameter and buffer of each model (None: a row without a
        model, skipped; a model listed twice is placed once), each behind a spacer of random
        size; the spacers are freed at the end. Gradients are dropped (the train step makes
        fresh ones)."""
        spacers, done = [], set()
        for model in models:
            if model is None or id(model) in done:
                continue
            done.add(id(model))
            size = int(self.rng.integers(SPACER_BYTES // SPACER_STEP)) * SPACER_STEP
            spacers.append(torch.empty(size, dtype=torch.uint8, device=device))
            replace_tensors(model)
        del spacers  # holes the round's activations fill


def replace_tensors(model: nn.Module) -> None:
    """Copy each of ``model``'s parameters and buffers (strided ones; an opaque layout such as
    oneDNN's stays) into new storage and let the model hold the copy: the same values, strides
    and dtype, a new address. Tied parameters stay tied (a Parameter is one object) and a
    buffer held by several modules is copied once and given to each."""
    model.zero_grad(set_to_none=True)
    parameters = [p for p in model.parameters() if p.layout == torch.strided]
    buffers = [(module, name, buffer) for module in model.modules()
               for name, buffer in module.named_buffers(recurse=False)
               if buffer is not None and buffer.layout == torch.strided]
    copies: dict[int, torch.Tensor] = {}  # id of the old tensor -> its copy
    for tensor in [*parameters, *(buffer for _, _, buffer in buffers)]:
        if id(tensor) not in copies:
            copies[id(tensor)] = tensor.detach().clone()  # all allocated while the old live
    for parameter in parameters:
        parameter.data = copies[id(parameter)]
    for module, name, buffer in buffers:
        setattr(module, name, copies[id(buffer)])  # a registered buffer's name: stays registered
