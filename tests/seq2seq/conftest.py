"""Fixtures of the application tests: a small model trained on the copy task."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from common.config import TransformerConfig
from common.masks import padding_mask
from common.weights import export_weights, import_weights
from seq2seq.data import tasks
from seq2seq.data.tasks import task_batches
from seq2seq.training.recipe import Recipe
from seq2seq.training.trainer import train_steps
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
    train_steps(model, batches, steps=150, recipe=Recipe(warmup=50, lr_factor=1.5))
    src, _ = tasks.sample_batch("copy", 64, vocab_size=10, min_len=1, max_len=8,
                                generator=torch.Generator().manual_seed(1))
    return CopyModel(config, export_weights(model), src)


# --- a tiny translation corpus, written by the tests themselves ----------------------------

SUBJECTS = (("the cat", "le chat"), ("the dog", "le chien"), ("my father", "mon pe\u0300re"),
            ("the girl", "la fille"), ("our teacher", "notre professeur"), ("a bird", "un oiseau"))
VERBS = (("sees", ("voit",)), ("likes", ("aime", "apprécie")), ("follows", ("suit",)),
         ("hears", ("entend",)))
OBJECTS = (("the house", "la maison"), ("the tree", "l'arbre"), ("a car", "une voiture"),
           ("the river", "la rivière"), ("my brother", "mon frère"), ("the garden", "le jardin"),
           ("a song", "une chanson"), ("the city", "la ville"), ("the sea", "la mer"),
           ("a book", "un livre"))
# exclamations as the exports write them: U+202F or U+00A0 before "!", several translations
EXCLAMATIONS = (("Run!", "Cours\u202f!"), ("Run!", "Courez\u202f!"), ("Help!", "À l'aide\u00a0!"),
                ("Help!", "Au secours\u202f!"), ("Thanks!", "Merci !"))
LONG_PAIR = ("The cat sees the house and the dog likes the tree.",  # 11 words: filtered out
             "Le chat voit la maison et le chien aime l'arbre.")


@dataclass(frozen=True)
class SampleCorpus:
    """A manythings-style export of ~300 English/French-like pairs: SUBJECT VERB OBJECT
    sentences (those with "likes" have two translations), exclamations with U+202F and U+00A0
    before "!", a "père" written decomposed (e + U+0300), one line with a third (attribution)
    column and one English sentence over 8 words."""

    path: Path
    pairs: tuple[tuple[str, str], ...]  # as written, in file order


def sample_pairs() -> list[tuple[str, str]]:
    pairs = [(f"{s_en} {v_en} {o_en}.".capitalize(), f"{s_fr} {v_fr} {o_fr}.".capitalize())
             for s_en, s_fr in SUBJECTS for v_en, v_frs in VERBS for o_en, o_fr in OBJECTS
             for v_fr in v_frs]
    return [*EXCLAMATIONS, *pairs, LONG_PAIR]


def write_export(path: Path, pairs: list[tuple[str, str]]) -> Path:
    """``pairs`` as fra.txt lines; the second line gets an attribution column."""
    lines = [f"{en}\t{fr}" + ("\tCC-BY 2.0 (France) Attribution: tatoeba.org #1 (x) & #2 (y)"
                              if number == 1 else "")
             for number, (en, fr) in enumerate(pairs)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def sample_corpus(tmp_path_factory) -> SampleCorpus:
    pairs = sample_pairs()
    return SampleCorpus(write_export(tmp_path_factory.mktemp("corpus") / "fra.txt", pairs), tuple(pairs))
