"""The key/value cache of incremental decoding: what the decoder keeps from one step to the next.

    cache = model.start_cache(memory, src_mask)      # each layer's cross-attention K/V, once
    hidden = model.decode_step(tgt[:, :1], cache)    # (B, 1, D); the cache grows by one position
    cache.reorder(origin)                            # beam search: new row i <- old row origin[i]

Per decoder layer a ``LayerCache`` holds the self-attention keys and values of the positions
decoded so far, which each step appends to, and the cross-attention keys and values of the
encoder output, computed once per source. Each variant keeps them in its own attention's layout
(the batch first in every one), so a cache serves only the model that started it.

The cache is updated in place — ``decode_step`` appends, ``reorder`` selects rows — as
fairseq's ``incremental_state`` and Hugging Face's ``DynamicCache`` are; nothing else about a
model changes while it decodes. After a step that raised, start a new cache.

Shape legend:
    B  batch (rows: sources, or sources x beams)    S  source length
    t  positions decoded so far                     D  model dim (d_model)
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, fields

import torch
from torch import Tensor, nn


@dataclass
class LayerCache:
    """One decoder layer's keys and values, in its variant's layout, e.g. (B, H, t, Dh)."""

    self_keys: Tensor  # the positions decoded so far; one more after every step
    self_values: Tensor
    cross_keys: Tensor  # of the encoder output: S positions, computed when the cache starts
    cross_values: Tensor

    def tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return self.self_keys, self.self_values, self.cross_keys, self.cross_values


class DecoderCache:
    """Everything a decode step reads besides its new tokens: per layer K/V, the source mask,
    and the target ids so far (their padding masks self-attention keys, as ``decoder_mask`` does
    in ``decode``). Built by ``EncoderDecoder.start_cache``; see the module docstring."""

    def __init__(self, model: nn.Module, layers: list[LayerCache], src_mask: Tensor | None,
                 memory: Tensor) -> None:
        batch = memory.shape[0]
        self._model = weakref.ref(model)  # which model's layout and weights these are
        self.layers = layers
        self.src_mask = None if src_mask is None else batch_first(src_mask, batch)  # (B, 1, 1, S)
        self.tokens = torch.empty(batch, 0, dtype=torch.long, device=memory.device)  # (B, t)

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def length(self) -> int:
        """Positions decoded so far: the next step's position."""
        return self.tokens.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].cross_keys.dtype

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def started_by(self, model: nn.Module) -> bool:
        return self._model() is model

    def nbytes(self) -> int:
        """Bytes of every layer's keys and values (not the ids and the mask)."""
        return sum(t.numel() * t.element_size() for layer in self.layers for t in layer.tensors())

    def reorder(self, origin: Tensor) -> None:
        """In place: row i becomes old row ``origin[i]`` — (B',) int64 ids in [0, B), repeats
        allowed, so one call both expands sources into beams and follows each beam's origin."""
        if not isinstance(origin, Tensor) or origin.dtype != torch.long or origin.ndim != 1:
            raise TypeError(
                f"origin must be a 1-d torch.long tensor of row ids, got {type_and_shape(origin)}"
            )
        if origin.device != self.device:
            raise ValueError(f"origin is on {origin.device} but the cache is on {self.device}")
        if origin.numel() == 0 or int(origin.min()) < 0 or int(origin.max()) >= self.batch_size:
            raise ValueError(f"origin must hold row ids in [0, {self.batch_size}), got {origin.tolist()}")
        for layer in self.layers:
            for field in fields(layer):
                setattr(layer, field.name, getattr(layer, field.name).index_select(0, origin))
        self.tokens = self.tokens.index_select(0, origin)
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, origin)


def batch_first(src_mask: Tensor, batch: int) -> Tensor:
    """A source-key mask that broadcasts to (B, H, 1, S), as (B, 1 or H, 1, S): a row per source,
    so that selecting rows selects their masks."""
    mask = src_mask.reshape((1,) * (4 - src_mask.ndim) + tuple(src_mask.shape))
    return mask.expand(batch, *mask.shape[1:])


def type_and_shape(value: object) -> str:
    """What an argument is, for an error message: "torch.float32 tensor of shape (2, 3)", or its type."""
    if isinstance(value, Tensor):
        return f"{value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__
