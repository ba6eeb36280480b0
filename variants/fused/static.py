"""fused's static-shape cached step, for ``torch.compile(mode="reduce-overhead")`` to capture as a
CUDA graph, beside ``start_cache``/``decode_step`` (the speed row's, no other variant has it)::

    cache = model.start_static_cache(memory, src_mask, max_len)  # buffers of max_len positions
    hidden = model.static_step(tgt, position, cache)             # (B, 1) ids, 0-d int64 -> (B, 1, D)
    hidden = model.static_step(tgt, position, cache.window(n))   # the same, reading n positions only

``static_step`` at position t, after the steps at 0..t-1 on the same cache, equals
``decode_step`` there: it writes the new keys and values into preallocated (B, max_len, D)
buffers at ``position`` (a 0-d tensor, not a Python int, stored as one in the cache) and attends
over every slot under a mask of fixed shape that opens the written, non-padding ones up to the
position (so a step run again at an earlier position sees only the slots before it). Nothing
changes shape between steps and nothing is read on the host inside a compiled step (its checks
read the values of ids and position only in eager mode, outside ``ids_range_checked``).
``start_static_cache(..., out=cache)`` refills a cache of the same shape in place, so a compiled
step sees the same buffers, at the same addresses, from one source batch to the next. A CUDA
graph may write a tensor in place only if it is marked static: whoever compiles the step marks
``cache.buffers()`` (``torch._dynamo.mark_static_address``), as ``seq2seq.fast.static_search`` does.

An eager step has no shapes to keep: ``cache.window(n)`` is the cache's first n positions, views
of the same buffers, and a step on it at a position below n writes into the cache and attends
over those n slots only, not over all ``max_len`` of them (the later slots are masked anyway).

Beam search keeps k rows per source (``beams=k``): the self-attention buffers hold B·k rows, row
i·k + j the j-th beam of source i, while the cross-attention keys and values, the same for every
beam of a source, are kept once per source, (B, S, D); the decoder's cross-attention reads a
source's k rows as k queries of that source (``CrossAttention.step``).

The decoder layers run their own ``step``; the one difference is the cache's ``add``, which here
writes at the position instead of appending.

Shape legend:
    B  batch    S  source length    D  model dim (d_model)    max_len  the cache's positions
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from common import checks
from common.cache import LayerCache, batch_first


@dataclass
class StaticLayerCache(LayerCache):
    """A ``LayerCache`` of fixed shape: self-attention keys and values (B, max_len, D), each step
    writing its position's; ``position`` () is that position, shared by every layer."""

    position: Tensor  # () int64: the slot the current step writes, set by ``static_step``

    def add(self, k: Tensor, v: Tensor) -> None:
        """Write one position's key and value, (B, 1, D) each, at ``position``, in place."""
        slot = self.position.view(1)  # (1,): index_copy_ takes a 1-d index
        self.self_keys.index_copy_(1, slot, k)  # (B, max_len, D)
        self.self_values.index_copy_(1, slot, v)  # (B, max_len, D)


@dataclass
class StaticCache:
    """Everything a static step reads besides its new ids, in buffers that keep their shape:
    ``batch_size`` rows of self-attention keys (k per source, in a beam cache) beside the
    cross-attention keys of the sources, one row each."""

    model: weakref.ref  # the model whose layout and weights these are
    layers: list[StaticLayerCache]  # per decoder layer; their ``position`` is ``position`` below
    position: Tensor  # () int64: the position the last step wrote
    key_mask: Tensor  # (B, max_len) bool: True at a written position whose id is not padding
    slots: Tensor  # (max_len,) int64: 0 .. max_len - 1, to open the slots up to the position
    src_mask: Tensor  # (sources, 1 or H, 1, S) bool: the keys a source's rows may attend (all, for None)

    @property
    def batch_size(self) -> int:
        return self.key_mask.shape[0]

    @property
    def max_len(self) -> int:
        return self.key_mask.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].cross_keys.dtype

    def reorder_beams(self, origin: Tensor, written: int | None = None) -> None:
        """Row i continues old row ``origin[i]`` (B,), in place, where every row comes from a row
        of its own source, as beam search's do: the self-attention keys, values and their mask
        move; the cross-attention keys and values and the source mask, the same for every row
        of a source, stay. ``written``: only the first ``written`` slots move (the later ones are
        written before any step reads them); None, every slot (shapes that never change)."""
        slots = slice(None) if written is None else slice(0, written)
        self.key_mask[:, slots] = self.key_mask[:, slots].index_select(0, origin)  # (B, written)
        for layer in self.layers:
            layer.self_keys[:, slots] = layer.self_keys[:, slots].index_select(0, origin)  # (B, written, D)
            layer.self_values[:, slots] = layer.self_values[:, slots].index_select(0, origin)

    def window(self, length: int) -> StaticCache:
        """The first ``length`` positions of this cache, as views of its buffers (nothing copied):
        a step on it at a position below ``length`` writes into this cache and reads ``length``
        slots of keys and values, not ``max_len``. For eager steps; a compiled step takes the
        whole cache, whose shapes never change."""
        if not 1 <= checks.check_int("length", length) <= self.max_len:
            raise ValueError(f"a window's length must lie in [1, max_len={self.max_len}], got {length}")
        positions = slice(0, length)
        layers = [StaticLayerCache(layer.self_keys[:, positions], layer.self_values[:, positions],
                                   layer.cross_keys, layer.cross_values, self.position)
                  for layer in self.layers]  # (B, length, D) views; the cross keys as they are
        return StaticCache(self.model, layers, self.position, self.key_mask[:, positions],
                           self.slots[positions], self.src_mask)

    def buffers(self) -> list[Tensor]:
        """Every tensor a step reads or writes: what a CUDA graph must find at the same address."""
        return [self.position, self.key_mask, self.slots, self.src_mask,
                *(tensor for layer in self.layers for tensor in layer.tensors())]


class StaticDecoding:
    """``start_static_cache`` and ``static_step`` on fused's ``Transformer`` (its decoder,
    target embedding and sinusoid table)."""

    def start_static_cache(self, memory: Tensor, src_mask: Tensor | None, max_len: int,
                           out: StaticCache | None = None, *, beams: int = 1) -> StaticCache:
        """(B, S, D) memory and its key mask -> a ``StaticCache`` of ``max_len`` positions and
        B·``beams`` rows (row i·beams + j the j-th of source i); or ``out``, a cache this model
        started for the same shapes, refilled in place."""
        checks.check_start(self, memory, src_mask)
        if not 1 <= checks.check_int("max_len", max_len) <= self.config.max_seq_len:
            raise ValueError(f"max_len must lie in [1, max_seq_len={self.config.max_seq_len}], got {max_len}")
        checks.check_int("beams", beams, low=1)
        batch, src_len, _ = memory.shape
        if src_mask is None:  # a mask of fixed shape all the same: every source key open
            src_mask = memory.new_ones(batch, 1, 1, src_len, dtype=torch.bool)
        src_mask = batch_first(src_mask, batch).expand(-1, -1, 1, src_len)  # (B, 1 or H, 1, S)
        if out is not None:
            self._check_static_cache("out", out)
            if (out.batch_size, out.max_len, out.src_mask.shape) != (batch * beams, max_len, src_mask.shape):
                raise ValueError(
                    f"out holds {out.batch_size} rows, max_len={out.max_len} and a src_mask of shape "
                    f"{tuple(out.src_mask.shape)}, not {batch * beams} (B={batch} x beams={beams}), "
                    f"{max_len} and {tuple(src_mask.shape)}; start a new cache")
        layers = self.decoder.start_cache(memory)  # the cross-attention keys and values, (B, S, D)
        if out is None:
            return self._new_static_cache(layers, src_mask, max_len, beams)
        for layer, start in zip(out.layers, layers, strict=True):
            layer.cross_keys.copy_(start.cross_keys.detach())
            layer.cross_values.copy_(start.cross_values.detach())
            layer.self_keys.zero_()  # finite: a hidden slot's weight is 0, and 0 x NaN is not
            layer.self_values.zero_()
        out.position.zero_()
        out.key_mask.fill_(False)
        out.src_mask.copy_(src_mask)
        return out

    def _new_static_cache(self, layers: list[LayerCache], src_mask: Tensor, max_len: int,
                          beams: int) -> StaticCache:
        """Zeroed self-attention buffers (B·beams, max_len, D) beside each layer's cross keys and
        values (B, S, D)."""
        batch, device = src_mask.shape[0] * beams, src_mask.device  # rows
        position = torch.zeros((), dtype=torch.long, device=device)  # ()
        static_layers = [
            # its own memory, outside any autograd graph: a refill writes these in place, which
            # a view of the fused K/V product (split's output) would refuse in grad mode
            StaticLayerCache(layer.cross_keys.new_zeros(batch, max_len, self.config.d_model),
                             layer.cross_keys.new_zeros(batch, max_len, self.config.d_model),
                             layer.cross_keys.detach().clone(), layer.cross_values.detach().clone(),
                             position)
            for layer in layers]
        return StaticCache(weakref.ref(self), static_layers, position,
                           torch.zeros(batch, max_len, dtype=torch.bool, device=device),
                           torch.arange(max_len, device=device), src_mask.clone())

    def _check_static_cache(self, name: str, cache: object) -> None:
        """``cache`` is a ``StaticCache`` this model started, on its device, in its dtype."""
        if not isinstance(cache, StaticCache):
            raise TypeError(f"{name} must be a StaticCache from start_static_cache, "
                            f"got {type(cache).__name__}")
        if cache.model() is not self:
            raise ValueError(f"{name} was started by another model; start one with its start_static_cache")
        device, dtype = checks.model_device(self), checks.model_dtype(self)
        if cache.position.device != device:
            raise ValueError(f"{name} is on {cache.position.device} but the model is on {device}; "
                             "start a new one")
        if cache.dtype != dtype:
            raise TypeError(f"{name} has dtype {cache.dtype} but the model's parameters are {dtype}; "
                            "start a new one")

    def static_step(self, tgt: Tensor, position: Tensor, cache: StaticCache) -> Tensor:
        """(B, 1) ids at ``position`` (0-d int64) -> (B, 1, D), as ``decode_step`` at that
        position; writes the position's keys, values and padding into ``cache`` in place."""
        self._check_static_cache("cache", cache)
        checks.check_static_step(self, tgt, position, cache.batch_size, cache.max_len)
        cache.position.copy_(position)
        slot = cache.position.view(1)  # (1,)
        # the slots written up to this position and not padding (the start token at position 0
        # never is, whatever its id: common.masks.target_padding_mask): a step run again at an
        # earlier position must not see the later slots a previous pass wrote
        real = (tgt != self.config.pad_id) | (cache.position == 0)  # (B, 1)
        cache.key_mask.index_copy_(1, slot, real)  # (B, max_len)
        visible = cache.key_mask & (cache.slots <= cache.position)  # (B, max_len)
        tgt_mask = visible[:, None, None, :]  # (B, 1, 1, max_len)
        x = self._embed_at(self.tgt_embed, tgt, self.pe.index_select(0, slot))  # (B, 1, D)
        return self.decoder.step(x, cache.layers, cache.src_mask, tgt_mask)  # (B, 1, D)
