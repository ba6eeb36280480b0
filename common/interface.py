"""The interface every variant implements, checked once, in one place.

A variant writes the three stages of the model — ``_encode``, ``_decode``, ``_project`` — on
arguments already known to be valid. ``EncoderDecoder`` wraps them in the public interface:
``encode``, ``decode`` and ``project`` check their arguments (``common.checks``) and call the
stage; ``forward`` checks all of its arguments once, before any stage runs, then composes them.
"""

from __future__ import annotations

import abc

from torch import Tensor, nn

from common import checks
from common.config import TransformerConfig


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
