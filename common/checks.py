"""Input checks shared by every variant's encode/decode/project, run before any tensor work.

Each check raises TypeError (wrong kind of thing) or ValueError (wrong shape, range or
device) with a message that names the argument, what it got and what was expected, so bad
input never turns into a silent broadcast, an index error deep inside a layer, or a CUDA
device-side assert.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def check_source(model: nn.Module, src: Tensor, src_mask: Tensor | None) -> None:
    """The arguments of ``encode``: (B, S) source ids and an optional mask over source keys."""
    config, device = model.config, model_device(model)
    _check_ids("src", src, config.src_vocab_size, "src_vocab_size", config.max_seq_len, device)
    batch, src_len = src.shape
    _check_mask("src_mask", src_mask, (batch, config.n_heads, src_len, src_len), device)


def check_target(
    model: nn.Module,
    tgt: Tensor,
    memory: Tensor,
    src_mask: Tensor | None,
    tgt_mask: Tensor | None,
) -> None:
    """The arguments of ``decode``: (B, T) target ids, (B, S, D) encoder output, two masks."""
    config, device = model.config, model_device(model)
    _check_ids("tgt", tgt, config.tgt_vocab_size, "tgt_vocab_size", config.max_seq_len, device)
    batch, tgt_len = tgt.shape
    _check_tensor("memory", memory, device)
    if not memory.is_floating_point():
        raise TypeError(f"memory must be a floating-point tensor, got dtype {memory.dtype}")
    if memory.ndim != 3 or memory.shape[0] != batch or memory.shape[2] != config.d_model:
        raise ValueError(
            f"memory must have shape (B={batch}, S, d_model={config.d_model}) to match tgt, "
            f"got {tuple(memory.shape)}"
        )
    src_len = memory.shape[1]
    _check_mask("tgt_mask", tgt_mask, (batch, config.n_heads, tgt_len, tgt_len), device)
    _check_mask("src_mask", src_mask, (batch, config.n_heads, tgt_len, src_len), device)


def check_same_batch(src: Tensor, tgt: Tensor) -> None:
    """``forward`` pairs sources with targets one to one."""
    tensors = isinstance(src, Tensor) and isinstance(tgt, Tensor) and src.ndim and tgt.ndim
    if tensors and src.shape[0] != tgt.shape[0]:
        raise ValueError(
            f"src and tgt must have the same batch size, got {src.shape[0]} and {tgt.shape[0]}"
        )


def check_hidden(model: nn.Module, hidden: Tensor) -> None:
    """The argument of ``project``: decoder output of width d_model."""
    _check_tensor("hidden", hidden, model_device(model))
    if not hidden.is_floating_point():
        raise TypeError(f"hidden must be a floating-point tensor, got dtype {hidden.dtype}")
    if hidden.ndim < 1 or hidden.shape[-1] != model.config.d_model:
        raise ValueError(
            f"hidden must have last dimension d_model={model.config.d_model}, "
            f"got shape {tuple(hidden.shape)}"
        )


def _check_tensor(name: str, value: object, device: torch.device) -> None:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.device != device:
        raise ValueError(
            f"{name} is on {value.device} but the model is on {device}; move one of them"
        )


def _check_ids(
    name: str, ids: object, vocab_size: int, vocab_field: str, max_len: int, device: torch.device
) -> None:
    _check_tensor(name, ids, device)
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor of token ids, got dtype {ids.dtype}")
    if ids.ndim != 2:
        raise ValueError(f"{name} must have shape (B, length), got {tuple(ids.shape)}")
    batch, length = ids.shape
    if batch == 0 or length == 0:
        raise ValueError(f"{name} is empty: shape {tuple(ids.shape)}; need B >= 1 and length >= 1")
    if length > max_len:
        raise ValueError(f"{name} length {length} exceeds max_seq_len {max_len}")
    low, high = (int(v) for v in torch.aminmax(ids))
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"{name} ids must lie in [0, {vocab_size}) ({vocab_field}), got min {low}, max {high}"
        )


def _check_mask(
    name: str, mask: object, expected: tuple[int, int, int, int], device: torch.device
) -> None:
    if mask is None:
        return
    _check_tensor(name, mask, device)
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor (True = may attend), got dtype {mask.dtype}")
    fits = mask.ndim <= 4 and all(
        size in (1, want) for size, want in zip(reversed(mask.shape), reversed(expected), strict=False)
    )
    if not fits:
        legend = "(B={}, H={}, T_query={}, T_key={})".format(*expected)
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} does not broadcast to {legend}; "
            "each dimension must equal that size or 1"
        )
