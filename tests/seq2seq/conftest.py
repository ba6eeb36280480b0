"""Fixtures of the application tests: a small model trained on the copy task."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from common.config import TransformerConfig
from common.masks import padding_mask
from common.weights import export_weights, import_weights
from seq2seq import tasks
from seq2seq.recipe import Recipe
from seq2seq.tasks import task_batches
from seq2seq.trainer import train
from variants import build


@dataclass(frozen=True)
class CopyModel:
    """Canonical weights of a small model trained briefly on the copy task, and sources to
    decode: its decodings are varied (some right, some wrong, of many lengths), unlike a random
    model's."""

    config: TransformerConfig
    weights: dict[str, torch.Tensor]
    src: torch.Tensor  # (64, S) copy-task sources, padded

    @property
    def src_mask(self) -> torch.Tensor:
        return padding_mask(self.src, self.config.pad_id)  # (64, 1, 1, S)

    def build(self, name: str, dtype: torch.dtype = torch.float32) -> nn.Module:
        """Variant ``name`` holding the trained weights, in eval mode."""
        model = build(name, self.config)
        import_weights(model, self.weights)
        return model.to(dtype).eval()


@pytest.fixture(scope="session")
def copy_model() -> CopyModel:
    config = TransformerConfig(d_model=32, n_heads=4, n_layers=1, d_ff=64, dropout=0.0,
                               src_vocab_size=10, tgt_vocab_size=10, max_seq_len=10)
    model = build("torch", config, seed=0)
    batches = task_batches("copy", 32, vocab_size=10, min_len=1, max_len=8, seed=0)
    train(model, batches, steps=150, recipe=Recipe(warmup=50, lr_factor=1.5))
    src, _ = tasks.sample_batch("copy", 64, vocab_size=10, min_len=1, max_len=8,
                                generator=torch.Generator().manual_seed(1))
    return CopyModel(config, export_weights(model), src)
