"""The interface every variant implements, and the one ``forward`` that composes it."""

from __future__ import annotations

import abc

from torch import Tensor, nn

from common import checks
from common.config import TransformerConfig


class EncoderDecoder(nn.Module, metaclass=abc.ABCMeta):
    """encode -> decode -> project. A variant writes the three stages; ``forward`` is shared."""

    config: TransformerConfig

    @abc.abstractmethod
    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """(B, S) source ids -> (B, S, D) memory."""

    @abc.abstractmethod
    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
    ) -> Tensor:
        """(B, T) target ids and (B, S, D) memory -> (B, T, D) hidden states."""

    @abc.abstractmethod
    def project(self, hidden: Tensor) -> Tensor:
        """(B, T, D) hidden states -> (B, T, V) log-probabilities."""

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
    ) -> Tensor:
        """(B, S) source and (B, T) target ids -> (B, T, V) next-token log-probabilities."""
        checks.check_forward(self, src, tgt, src_mask, tgt_mask)  # every input, before encoding
        memory = self.encode(src, src_mask)
        return self.project(self.decode(tgt, memory, src_mask, tgt_mask))
