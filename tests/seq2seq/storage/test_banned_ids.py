"""A model file's banned ids (``ModelFile.banned_ids``): saved and loaded as plain data, checked
where a record is made and where a file is read (ints within the target vocabulary, each once,
in order), and () for a file written before the field existed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from common.config import TransformerConfig
from common.weights import export_weights
from seq2seq.storage.model_file import ModelFile, load, save
from variants import build

CONFIG = TransformerConfig(d_model=8, n_heads=2, n_layers=1, d_ff=16, dropout=0.0,
                           src_vocab_size=9, tgt_vocab_size=7, max_seq_len=8)
# written by the model file code as it stood before banned_ids (tests/fixtures)
OLD_FILE = Path(__file__).parents[2] / "fixtures" / "model-file-before-banned-ids.pt"


def model_file(**fields) -> ModelFile:
    return ModelFile("explicit", CONFIG, {}, export_weights(build("explicit", CONFIG, seed=0)), **fields)


def test_banned_ids_are_saved_and_read_back(tmp_path):
    path = save(model_file(banned_ids=(0, 5)), tmp_path / "m.pt")
    assert load(path).banned_ids == (0, 5)
    assert torch.load(path, weights_only=True)["banned_ids"] == (0, 5)  # plain data in the archive
    assert load(save(model_file(), tmp_path / "none.pt")).banned_ids == ()


def test_a_file_written_before_the_field_existed_bans_nothing():
    payload = torch.load(OLD_FILE, weights_only=True)
    assert "banned_ids" not in payload
    record = load(OLD_FILE)
    assert record.banned_ids == ()
    assert record.config.tgt_vocab_size == 12


@pytest.mark.parametrize("banned, said", [
    ((7,), r"must lie in \[0, tgt_vocab_size=7\)"),  # the target vocabulary, not the source's 9
    ((-1,), r"must lie in \[0, tgt_vocab_size=7\)"),
    ((3, 1), "must be increasing, each id once"),
    ((2, 2), "must be increasing, each id once"),
    ([2], "must be a tuple of ints"),
    ((True,), "must be a tuple of ints"),
    ((2.0,), "must be a tuple of ints"),
])
def test_a_record_with_bad_banned_ids_is_refused_by_name(banned, said):
    with pytest.raises(ValueError, match=rf"ModelFile\.banned_ids {said}"):
        model_file(banned_ids=banned)


@pytest.mark.parametrize("banned, said", [
    ((7,), r"must lie in \[0, tgt_vocab_size=7\)"),
    ("0", "must be a tuple of ints"),
])
def test_a_file_with_bad_banned_ids_is_refused_naming_the_file(banned, said, tmp_path, monkeypatch):
    """A file holding banned ids the model cannot have, with a matching digest (as a writer
    without the check would write it), is refused, naming the file and the field."""
    def unchecked(self: ModelFile) -> None:
        """A record made without the check."""

    with monkeypatch.context() as patch:
        patch.setattr(ModelFile, "__post_init__", unchecked)
        bad = save(model_file(banned_ids=banned), tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=rf"{re.escape(str(bad))} holds invalid banned_ids: they {said}"):
        load(bad)
