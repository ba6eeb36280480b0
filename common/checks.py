"""Input checks shared by every variant's encode/decode/project/forward and its cached decoding
(start_cache/decode_step), run before any tensor work.

Each check raises TypeError (wrong kind of thing, dtype included) or ValueError (wrong shape,
range or device) with a message that names the argument, what it got and what was expected, so bad
input never turns into a silent broadcast, an index error deep inside a layer, or a CUDA
device-side assert.

The settings classes and entry points above the model check their numbers with the helpers
below, one spelling each: ``check_int`` (an int, at least ``low``), ``check_number`` (a finite
number in a range), ``check_seed`` (a seed every consumer here takes) and ``KindError``, what
they raise for a value of the wrong kind.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor, nn

from common.cache import DecoderCache

# nn.Embedding (and advanced indexing, which reads uint8 as a boolean mask) take these only
ID_DTYPES = (torch.int64, torch.int32)


class KindError(TypeError, ValueError):
    """A value of the wrong kind (a float where an int belongs, a bool where a number does): a
    TypeError, and a ValueError too, so a command that turns ValueError into a usage error sees it."""


def check_int(name: str, value: object, *, low: int | None = None) -> int:
    """``value`` if it is an int (a bool is not one) and, with ``low``, at least ``low``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise KindError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}")
    return value


# Seeds: 0..2**32 - 1, the range every consumer of a seed here takes alike: numpy's generators
# (np.random.default_rng) refuse negative seeds; torch's CPU generator keeps only a seed's low
# 32 bits (2**32 and 0 draw the same stream) and refuses anything past 2**64 - 1; and the
# offsets added to a seed for other streams (seq2seq: + 2**30 + rank, + 2**31) stay in range.
SEED_HIGH = 2**32 - 1


def check_seed(name: str, value: object) -> int:
    """``value`` if it is an int seed in ``0..SEED_HIGH`` (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise KindError(f"{name} must be an int seed, got {type(value).__name__} {value!r}")
    if not 0 <= value <= SEED_HIGH:
        raise ValueError(f"{name} must be a seed in 0..{SEED_HIGH} (2**32 - 1), got {value}")
    return value


def check_number(name: str, value: object, *, low: float = 0.0, high: float = math.inf,
                 low_closed: bool = False) -> float:
    """``value`` if it is a number (int or float, not a bool) with ``low < value < high``
    (``low <= value`` when ``low_closed``): never NaN, and finite unless ``high`` is."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise KindError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not ((low <= value) if low_closed else (low < value)) or not value < high:
        if high == math.inf:
            bounds = f"finite and >= {low:g}" if low_closed or low != 0 else "positive and finite"
        else:
            bounds = f"in {'[' if low_closed else '('}{low:g}, {high:g})"
        raise ValueError(f"{name} must be {bounds}, got {value!r}")
    return value


_RANGE_CHECKED_BY_CALLER: ContextVar[bool] = ContextVar("range_checked_by_caller", default=False)


@contextmanager
def ids_range_checked() -> Iterator[None]:
    """Skip the id range check (its one host sync per call) inside this block.

    For a caller that runs the same ids many times and has checked them once, outside the
    block, by a checked call: ``benchmarks/timings/bench_speed.py``'s timed CUDA steps, and
    ``benchmarks/timings/bench_range_check.py``, which times a step both ways; and a loop whose ids are
    in range by construction (``seq2seq.fast.static_search``: argmax ids, its own positions). On CUDA
    the sync would otherwise make small timed steps measure the launch queue. Every other check
    (kind, dtype, shape, device, length) still runs; an id out of range inside the block meets the
    embedding's own error (on CUDA a device-side assert, which poisons the context).
    """
    token = _RANGE_CHECKED_BY_CALLER.set(True)
    try:
        yield
    finally:
        _RANGE_CHECKED_BY_CALLER.reset(token)


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def check_source(model: nn.Module, src: Tensor, src_mask: Tensor | None) -> None:
    """The arguments of ``encode``: (B, S) source ids and an optional mask over source keys."""
    config, device = model.config, model_device(model)
    check_ids("src", src, config.src_vocab_size, "src_vocab_size", config.max_seq_len, device)
    batch, src_len = src.shape
    check_mask("src_mask", src_mask, (batch, config.n_heads, src_len, src_len), device)


def check_target(
    model: nn.Module,
    tgt: Tensor,
    memory: Tensor,
    src_mask: Tensor | None,
    tgt_mask: Tensor | None,
) -> None:
    """The arguments of ``decode``: (B, T) target ids, (B, S, D) encoder output, two masks."""
    config, device = model.config, model_device(model)
    check_ids("tgt", tgt, config.tgt_vocab_size, "tgt_vocab_size", config.max_seq_len, device)
    _check_memory(model, memory, tgt.shape[0])
    _check_decoder_masks(model, tgt, memory.shape[1], src_mask, tgt_mask, device)


def check_start(model: nn.Module, memory: Tensor, src_mask: Tensor | None) -> None:
    """The arguments of ``start_cache``: (B, S, D) encoder output and a mask over its keys."""
    _check_memory(model, memory)
    batch, src_len, _ = memory.shape
    # one mask serves every step, so it masks keys only: its query dimension is 1
    check_mask("src_mask", src_mask, (batch, model.config.n_heads, 1, src_len), model_device(model))


def check_step(model: nn.Module, tgt: Tensor, cache: object) -> None:
    """The arguments of ``decode_step``: (B, 1) next ids, and a cache this model started for B rows
    that still has a position left and matches the model's dtype and device."""
    config, device = model.config, model_device(model)
    if not isinstance(cache, DecoderCache):
        raise TypeError(f"cache must be a DecoderCache from model.start_cache, got {type(cache).__name__}")
    if not cache.started_by(model):
        raise ValueError("cache was started by another model; start one with this model's start_cache")
    _check_next_ids(model, tgt, cache.batch_size)
    if cache.length >= config.max_seq_len:
        raise ValueError(
            f"decode_step at position {cache.length} is past max_seq_len {config.max_seq_len} "
            f"(positions 0..{config.max_seq_len - 1})"
        )
    if cache.device != device:
        raise ValueError(f"cache is on {cache.device} but the model is on {device}; start a new one")
    _check_dtype("cache", cache.dtype, model, device)


def check_static_step(model: nn.Module, tgt: Tensor, position: Tensor, batch: int, max_len: int) -> None:
    """The ids and position of a static-shape cached step (``variants.fused``'s ``static_step``):
    (B, 1) next ids and a 0-d int64 tensor in [0, max_len). Their values are read (one host sync)
    only where the ids' range is (not under torch.compile, not inside ``ids_range_checked``)."""
    device = model_device(model)
    _check_next_ids(model, tgt, batch)
    _check_tensor("position", position, device)
    if position.dtype != torch.int64 or position.ndim != 0:
        raise TypeError(f"position must be a 0-d torch.int64 tensor, got {position.dtype} "
                        f"tensor of shape {tuple(position.shape)}")
    if _may_read_values(device) and not 0 <= int(position) < max_len:
        raise ValueError(f"position must lie in [0, {max_len}) (the cache's max_len), got {int(position)}")


def _check_next_ids(model: nn.Module, tgt: Tensor, batch: int) -> None:
    """(B, 1) ids of the next position, for a cache of ``batch`` rows."""
    config = model.config
    check_ids("tgt", tgt, config.tgt_vocab_size, "tgt_vocab_size", config.max_seq_len, model_device(model))
    if tgt.shape != (batch, 1):
        raise ValueError(
            f"tgt must hold one new id per cached row, shape (B={batch}, 1), got {tuple(tgt.shape)}"
        )


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
    check_ids("tgt", tgt, config.tgt_vocab_size, "tgt_vocab_size", config.max_seq_len, device)
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
    """The argument of ``project``: (B, T, D) decoder output, as ``decode`` returns it (so what
    ``decode`` refuses, an empty batch or sequence, ``project`` refuses too)."""
    d_model = model.config.d_model
    _check_floating("hidden", hidden, model)
    if hidden.ndim != 3:
        raise ValueError(f"hidden must have shape (B, T, d_model={d_model}), got {tuple(hidden.shape)}")
    if hidden.shape[-1] != d_model:
        raise ValueError(
            f"hidden must have last dimension d_model={d_model}, got shape {tuple(hidden.shape)}"
        )
    if 0 in hidden.shape:
        raise ValueError(f"hidden is empty: shape {tuple(hidden.shape)}; need B >= 1 and T >= 1")


def _check_tensor(name: str, value: object, device: torch.device) -> None:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.device != device:
        raise ValueError(
            f"{name} is on {value.device} but the model is on {device}; move one of them"
        )


def model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the model's floating-point parameters."""
    return next(p.dtype for p in model.parameters() if p.dtype.is_floating_point)


def _check_memory(model: nn.Module, memory: object, batch: int | None = None) -> None:
    """(B, S, D) encoder output in the model's dtype, on its device; B = ``batch`` if given."""
    d_model = model.config.d_model
    _check_floating("memory", memory, model)
    if memory.ndim != 3 or memory.shape[2] != d_model or batch not in (None, memory.shape[0]):
        expected = f"(B, S, d_model={d_model})" if batch is None else \
            f"(B={batch}, S, d_model={d_model}) to match tgt"
        raise ValueError(f"memory must have shape {expected}, got {tuple(memory.shape)}")
    if 0 in memory.shape:
        raise ValueError(f"memory is empty: shape {tuple(memory.shape)}; need B >= 1 and S >= 1")


def _check_floating(name: str, value: object, model: nn.Module) -> None:
    """A floating-point tensor on the model's device, in the model's dtype (or autocast's)."""
    device = model_device(model)
    _check_tensor(name, value, device)
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    _check_dtype(name, value.dtype, model, device)


def _check_dtype(name: str, dtype: torch.dtype, model: nn.Module, device: torch.device) -> None:
    """Activations come in the parameters' dtype, or under autocast in autocast's: anything else
    would fail inside the first matrix product (or, for a wider type, silently upcast)."""
    expected = model_dtype(model)
    allowed = {expected}
    if device.type != "meta" and torch.is_autocast_enabled(device.type):
        allowed.add(torch.get_autocast_dtype(device.type))
    if dtype not in allowed:
        raise TypeError(
            f"{name} has dtype {dtype} but the model's parameters are {expected}; "
            f"cast one of them to the other (model.to(dtype) or {name}.to(dtype))"
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


def check_ids(
    name: str, ids: object, vocab_size: int, vocab_field: str, max_len: int, device: torch.device
) -> None:
    """``ids`` (B, L) int64 or int32 on ``device``: L <= ``max_len``, every id in [0, vocab_size)."""
    _check_tensor(name, ids, device)
    _check_id_kind(name, ids)
    length = ids.shape[1]
    if length > max_len:
        raise ValueError(f"{name} length {length} exceeds max_seq_len {max_len}")
    if not _may_read_values(ids.device):
        return
    # One host sync; on CUDA it turns a device-side assert in the embedding into this error.
    low, high = (int(v) for v in torch.aminmax(ids))
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"{name} ids must lie in [0, {vocab_size}) ({vocab_field}={vocab_size}), "
            f"got min {low}, max {high}"
        )


def _may_read_values(device: torch.device) -> bool:
    """Whether a check may read a tensor's values (a host sync) to range-check them."""
    if device.type == "meta":
        return False  # shape-only run: there are no values to range-check
    if torch.compiler.is_compiling():
        return False  # reading values inside torch.compile would split the graph: range unchecked there
    # inside ids_range_checked(): the caller checked these ids once, outside the loop
    return not _RANGE_CHECKED_BY_CALLER.get()


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
    check_mask("tgt_mask", tgt_mask, (batch, heads, tgt_len, tgt_len), device)
    check_mask("src_mask", src_mask, (batch, heads, tgt_len, src_len), device)


def check_mask(
    name: str, mask: object, expected: tuple[int, int, int, int], device: torch.device
) -> None:
    """A bool mask (or None) on ``device`` that broadcasts to ``expected`` (B, H, T_query, T_key)
    and reads the same whatever the sizes (no rank-3 layout)."""
    if mask is None:
        return
    _check_tensor(name, mask, device)
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor (True = may attend), got dtype {mask.dtype}")
    _check_unambiguous(name, mask, expected[0])
    fits = mask.ndim <= 4 and all(
        size in (1, want) for size, want in zip(reversed(mask.shape), reversed(expected), strict=False)
    )
    if not fits:
        legend = "(B={}, H={}, T_query={}, T_key={})".format(*expected)
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} does not broadcast to {legend}; "
            "each dimension must equal that size or 1"
        )


def _check_unambiguous(name: str, mask: Tensor, batch: int) -> None:
    """Refuse a mask of rank 2 or 3 whose first axis has the batch size.

    A mask of lower rank lines up with (B, H, T_query, T_key) from the right, as broadcasting
    does, so the first axis of a (B, 1, S) mask, the layout most tutorials use, would be read
    as heads, and that of a (B, S) key mask as queries. Both would then run, silently wrong,
    exactly when the batch size happens to equal n_heads or the query length. Which reading
    was meant cannot be told from the sizes, so neither is picked: the message names the
    four-axis layout that says it.
    """
    if mask.ndim not in (2, 3) or batch == 1 or mask.shape[0] != batch:
        return
    shape = tuple(mask.shape)
    if mask.ndim == 3:
        read_as = "H (heads)"
        per_row = f"{name}[:, None] of shape {(batch, 1, *shape[1:])} for a mask per batch row"
        other = f"shape (1, {shape[0]}, {shape[1]}, {shape[2]}) for one mask per head"
    else:
        read_as = "T_query (queries)"
        per_row = f"{name}[:, None, None] of shape {(batch, 1, 1, shape[1])} for a key mask per batch row"
        other = f"{name}[None, None] of shape {(1, 1, *shape)} for one mask over queries and keys"
    raise ValueError(
        f"{name} of shape {shape} is ambiguous: its first axis has the batch size B={batch}, but a "
        f"rank-{mask.ndim} mask lines up with (B, H, T_query, T_key) from the right, which reads "
        f"that axis as {read_as}; give all four axes: {per_row}, or {other}"
    )
