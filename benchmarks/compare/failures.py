"""A failed step (an out-of-memory above all) is reported in its cell and the run goes on."""

from __future__ import annotations

import gc

import torch
from torch import nn

from common.cli import error_line

# torch.OutOfMemoryError is newer than torch.cuda.OutOfMemoryError (which it generalises): name
# whichever this torch has, so catching an error never turns into an AttributeError.
OUT_OF_MEMORY = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is PyTorch's or the C library's way of saying memory ran out."""
    message = str(error).lower()
    return isinstance(error, (OUT_OF_MEMORY, MemoryError)) or (
        isinstance(error, RuntimeError)
        and ("out of memory" in message or "can't allocate memory" in message))


def failure_cell(error: BaseException) -> str:
    """What a failed step's cell reads: "OOM", or the error's type and the start of its first line."""
    if is_out_of_memory(error):
        return "OOM"
    return error_line(error)[:160]


def release(model: nn.Module | None, device: str) -> None:
    """Drop the model's gradients and the allocator's cached blocks, so the rest can run."""
    if model is not None:
        model.zero_grad(set_to_none=True)
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def recover(error: BaseException, model: nn.Module, device: str) -> str:
    """After ``model``'s step raised ``error``: free what it held; return its cell's text."""
    release(model, device)
    return failure_cell(error)
