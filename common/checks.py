"""Input checks shared by every variant's encode/decode/project/forward, run before any tensor work.

Each check raises TypeError (wrong kind of thing) or ValueError (wrong shape, range or
device) with a message that names the argument, what it got and what was expected, so bad
input never turns into a silent broadcast, an index error deep inside a layer, or a CUDA
device-side assert.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

# nn.Embedding (and advanced indexing, which reads uint8 as a boolean mask) take these only
ID_DTYPES = (torch.int64, torch.int32)


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
    batch = tgt.shape[0]
    _check_tensor("memory", memory, device)
    if not memory.is_floating_point():
        raise TypeError(f"memory must be a floating-point tensor, got dtype {memory.dtype}")
    if memory.ndim != 3 or memory.shape[0] != batch or memory.shape[2] != config.d_model:
        raise ValueError(
            f"memory must have shape (B={batch}, S, d_model={config.d_model}) to match tgt, "
            f"got {tuple(memory.shape)}"
        )
    if memory.shape[1] == 0:
        raise ValueError(f"memory is empty: shape {tuple(memory.shape)}; need S >= 1")
    _check_decoder_masks(model, tgt, memory.shape[1], src_mask, tgt_mask, device)


def check_forward(
    model: nn.Module,
    src: Tensor,
    tgt: Tensor,
    src_mask: Tensor | None,
    tgt_mask: Tensor | None,
) -> None:
    """The arguments of ``forward``, all of them once, before the encoder runs.

    ``forward`` then runs the stages unchecked: the memory it hands the decoder is the encoder's
    own output, so only the arguments need checking, and each id tensor is read once.
    """
    config, device = model.config, model_device(model)
    check_same_batch(src, tgt)
    check_source(model, src, src_mask)
    _check_ids("tgt", tgt, config.tgt_vocab_size, "tgt_vocab_size", config.max_seq_len, device)
    _check_decoder_masks(model, tgt, src.shape[1], src_mask, tgt_mask, device)


def check_same_batch(src: Tensor, tgt: Tensor) -> None:
    """``forward`` pairs sources with targets one to one.

    Needs no model, so it also checks what it can of both id tensors (kind, dtype, rank,
    emptiness) before comparing their batch sizes; ``check_source`` and ``check_target`` add
    the device, range and length checks.
    """
    _check_id_kind("src", src)
    _check_id_kind("tgt", tgt)
    if src.shape[0] != tgt.shape[0]:
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


def _check_id_kind(name: str, ids: object) -> None:
    """Everything about an id tensor that needs no model: type, dtype, rank, emptiness."""
    if not isinstance(ids, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(ids).__name__}")
    if ids.dtype not in ID_DTYPES:
        raise TypeError(
            f"{name} must be an integer tensor of token ids (torch.int64 or torch.int32), "
            f"got dtype {ids.dtype}"
        )
    if ids.ndim != 2:
        raise ValueError(f"{name} must have shape (B, length), got {tuple(ids.shape)}")
    if ids.numel() == 0:
        raise ValueError(f"{name} is empty: shape {tuple(ids.shape)}; need B >= 1 and length >= 1")


def _check_ids(
    name: str, ids: object, vocab_size: int, vocab_field: str, max_len: int, device: torch.device
) -> None:
    _check_tensor(name, ids, device)
    _check_id_kind(name, ids)
    length = ids.shape[1]
    if length > max_len:
        raise ValueError(f"{name} length {length} exceeds max_seq_len {max_len}")
    if ids.device.type == "meta":
        return  # shape-only run: there are no values to range-check
    if torch.compiler.is_compiling():
        return  # reading values inside torch.compile would split the graph: range unchecked there
    # One host sync; on CUDA it turns a device-side assert in the embedding into this error.
    low, high = (int(v) for v in torch.aminmax(ids))
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"{name} ids must lie in [0, {vocab_size}) ({vocab_field}={vocab_size}), "
            f"got min {low}, max {high}"
        )


def _check_decoder_masks(
    model: nn.Module,
    tgt: Tensor,
    src_len: int,
    src_mask: Tensor | None,
    tgt_mask: Tensor | None,
    device: torch.device,
) -> None:
    batch, tgt_len = tgt.shape
    heads = model.config.n_heads
    _check_mask("tgt_mask", tgt_mask, (batch, heads, tgt_len, tgt_len), device)
    _check_mask("src_mask", src_mask, (batch, heads, tgt_len, src_len), device)


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
