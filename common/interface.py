"""The interface every variant implements, checked once, in one place.

A variant writes the three stages of the model — ``_encode``, ``_decode``, ``_project`` — on
arguments already known to be valid. ``EncoderDecoder`` wraps them in the public interface:
``encode``, ``decode`` and ``project`` check their arguments (``common.checks``) and call the
stage; ``forward`` checks all of its arguments once, before any stage runs, then composes them.

Incremental decoding is two more stages a variant may write, ``_start_cache`` and
``_decode_step``, behind ``start_cache`` and ``decode_step`` (``has_cache`` says whether it
did; the torch reference does not, and decodes by full recompute)::

    cache = model.start_cache(memory, src_mask)   # (B, S, D) -> each layer's cross-attention K/V
    hidden = model.decode_step(tgt_last, cache)   # (B, 1) ids at position t -> (B, 1, D)

``decode_step`` at position t equals ``decode`` of the t + 1 ids so far under
``decoder_mask``, at its last position; the cache (``common.cache``) grows in place. Each
from-scratch variant writes the two stages over its decoder layers' ``start_cache(memory)`` and
``step(x, cache, src_mask, tgt_mask)``, below its forward path, so no ``forward`` takes a cache.
"""

from __future__ import annotations

import abc

import torch
from torch import Tensor, nn

from common import checks
from common.cache import DecoderCache, LayerCache
from common.config import TransformerConfig
from common.masks import target_padding_mask


class EncoderDecoder(nn.Module, metaclass=abc.ABCMeta):
    """encode -> decode -> project. A variant writes the stages; checking and ``forward`` are shared."""

    config: TransformerConfig

    @abc.abstractmethod
    def _encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        """(B, S) source ids -> (B, S, D) memory."""

    @abc.abstractmethod
    def _decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None
    ) -> Tensor:
        """(B, T) target ids and (B, S, D) memory -> (B, T, D) hidden states."""

    @abc.abstractmethod
    def _project(self, hidden: Tensor) -> Tensor:
        """(B, T, D) hidden states -> (B, T, V) log-probabilities."""

    def _start_cache(self, memory: Tensor) -> list[LayerCache]:
        """(B, S, D) memory -> per decoder layer its cross-attention keys and values, and empty
        self-attention ones. A variant without a cache leaves this (and ``_decode_step``) out."""
        raise NotImplementedError

    def _decode_step(
        self, tgt: Tensor, position: int, cache: list[LayerCache], src_mask: Tensor | None, tgt_mask: Tensor
    ) -> Tensor:
        """(B, 1) ids at ``position`` -> (B, 1, D); appends their keys and values to ``cache``.

        ``src_mask`` (B, 1 or H, 1, S) masks source keys, ``tgt_mask`` (B, 1, 1, position + 1)
        the padding among the target keys, this position's included."""
        raise NotImplementedError

    @property
    def has_cache(self) -> bool:
        """Whether this variant writes the cached decode step (else: decode by full recompute)."""
        return type(self)._decode_step is not EncoderDecoder._decode_step

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """(B, S) source ids -> (B, S, D) memory."""
        checks.check_source(self, src, src_mask)
        return self._encode(src, src_mask)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
    ) -> Tensor:
        """(B, T) target ids and (B, S, D) memory -> (B, T, D) hidden states."""
        checks.check_target(self, tgt, memory, src_mask, tgt_mask)
        return self._decode(tgt, memory, src_mask, tgt_mask)

    def project(self, hidden: Tensor) -> Tensor:
        """(B, T, D) hidden states -> (B, T, V) log-probabilities."""
        checks.check_hidden(self, hidden)
        return self._project(hidden)

    def start_cache(self, memory: Tensor, src_mask: Tensor | None = None) -> DecoderCache:
        """(B, S, D) memory and its (B, 1, 1, S) key mask -> a cache to decode from, one step at a
        time; the cross-attention keys and values of ``memory`` are computed here, once."""
        if not self.has_cache:
            raise NotImplementedError(
                f"{type(self).__module__} has no key/value cache: decode it by full recompute, "
                "as greedy_decode and beam_search do"
            )
        checks.check_start(self, memory, src_mask)
        return DecoderCache(self, self._start_cache(memory), src_mask, memory)

    def decode_step(self, tgt: Tensor, cache: DecoderCache) -> Tensor:
        """(B, 1) ids at the next position t -> (B, 1, D) hidden state there.

        Equals ``decode`` of the ids so far (t + 1 of them, ``cache.tokens`` and ``tgt``) under
        ``decoder_mask``, at its last position. Updates ``cache`` in place: its ids, and every
        layer's self-attention keys and values, grow by one position."""
        checks.check_step(self, tgt, cache)
        tokens = torch.cat([cache.tokens, tgt.long()], dim=1)  # (B, t + 1)
        tgt_mask = target_padding_mask(tokens, self.config.pad_id)  # (B, 1, 1, t + 1): the last query's row
        hidden = self._decode_step(tgt, cache.length, cache.layers, cache.src_mask, tgt_mask)
        cache.tokens = tokens
        return hidden

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
    ) -> Tensor:
        """(B, S) source and (B, T) target ids -> (B, T, V) next-token log-probabilities."""
        checks.check_forward(self, src, tgt, src_mask, tgt_mask)  # every input, once, before encoding
        memory = self._encode(src, src_mask)
        return self._project(self._decode(tgt, memory, src_mask, tgt_mask))
