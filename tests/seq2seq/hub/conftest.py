"""The tiny checkpoints of both families (``seq2seq.hub.tiny``), each built, saved and
converted once per session."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
pytest.importorskip("sacremoses", reason="the hf extra (sacremoses) is not installed")
pytest.importorskip("sentencepiece", reason="the translate extra (sentencepiece) is not installed")

from seq2seq.hub import tiny
from seq2seq.hub.from_hf import convert
from seq2seq.storage.model_file import ModelFile


@dataclass(frozen=True)
class Tiny:
    """One tiny checkpoint: its folder and its conversion."""

    name: str
    folder: Path
    record: ModelFile

    @property
    def family(self) -> str:
        return self.record.tokenizer["kind"]


_BUILT: dict[str, Tiny] = {}


def tiny_checkpoint(name: str, tmp_path_factory) -> Tiny:
    if name not in _BUILT:
        folder = tiny.build(name, tmp_path_factory.mktemp(name))
        _BUILT[name] = Tiny(name, folder, convert(folder))
    return _BUILT[name]


@pytest.fixture(params=tiny.NAMES)
def checkpoint(request, tmp_path_factory) -> Tiny:
    """Each tiny checkpoint in turn (built once per session)."""
    return tiny_checkpoint(request.param, tmp_path_factory)


@pytest.fixture
def tiny_named(tmp_path_factory):
    """The tiny checkpoint of a given name (built once per session)."""
    return lambda name: tiny_checkpoint(name, tmp_path_factory)
