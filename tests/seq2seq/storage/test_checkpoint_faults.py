"""Save and load are symmetric (what ``save`` accepts, ``load`` reads back; the rest is refused
before anything is written), ``load`` never advises ``weights_only=False``, the temporary file
of a save killed mid-write is removed by the next save, and averaging refuses non-finite
weights."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.config import TransformerConfig
from common.weights import export_weights
from seq2seq.storage.model_file import FORMAT, ModelFile, load, save
from seq2seq.training.averaging import average_files
from variants import build

CONFIG = TransformerConfig(d_model=16, n_heads=2, n_layers=1, d_ff=16, dropout=0.0,
                           src_vocab_size=9, tgt_vocab_size=9, max_seq_len=8)


def model_file(**settings) -> ModelFile:
    return ModelFile(variant="explicit", config=CONFIG, settings=settings,
                     weights=export_weights(build("explicit", CONFIG, seed=0)))


def test_save_refuses_what_load_could_not_read_and_writes_nothing(tmp_path):
    with pytest.raises(ValueError, match=r"cannot save .*load could not read it back:\n  "
                                         r"settings\['out'\]: pathlib\.\w*Path .* is not plain data"):
        save(model_file(out=Path("runs/a")), tmp_path / "m.pt")
    with pytest.raises(ValueError, match=r"settings\['data'\]\['sizes'\]\[1\]: builtins\.set"):
        save(model_file(data={"sizes": [1, {2}]}), tmp_path / "m.pt")
    assert list(tmp_path.iterdir()) == []


def test_what_save_accepts_load_reads_back(tmp_path):
    settings = {"data": {"task": "copy", "lengths": (1, 5), "seed": None}, "scale": 0.5, "bf16": False,
                "nested": [{"a": 1}, [2.0, "x"]], "steps": {3: "three"}}
    path = save(model_file(**settings), tmp_path / "m.pt")
    assert load(path).settings == settings


def test_a_renamed_key_or_a_changed_value_is_refused_as_corrupt(tmp_path):
    """The digest covers the keys as well as the values: a file edited after it was written, with
    its digest left as it was, is refused."""
    path = save(model_file(data={"task": "copy"}), tmp_path / "m.pt")
    for edit in ({"task_": "copy"}, {"task": "reverse"}):
        payload = torch.load(path, weights_only=True)
        payload["settings"]["data"] = edit
        torch.save(payload, tmp_path / "edited.pt")
        with pytest.raises(ValueError, match="contents differ from the digest recorded when it was written"):
            load(tmp_path / "edited.pt")


def test_load_of_random_bytes_gives_no_unsafe_advice(tmp_path):
    path = tmp_path / "noise.pt"
    path.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(ValueError, match="is not a readable checkpoint") as info:
        load(path)
    assert "weights_only" not in str(info.value)


def test_load_of_a_file_holding_other_objects_names_them_without_unsafe_advice(tmp_path):
    path = tmp_path / "foreign.pt"
    torch.save({"format": FORMAT, "settings": Path("runs/a")}, path)
    with pytest.raises(ValueError, match=r"holds a pathlib\.\w*Path, which is not plain data") as info:
        load(path)
    assert "weights_only" not in str(info.value)


def finished_process_id() -> int:
    """The id of a process that has run and ended (a killed writer's, for the test below)."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    return int(child.stdout)


@pytest.mark.skipif(os.name != "posix", reason="process probing is POSIX only")
def test_the_next_save_removes_a_killed_writers_temporary_file(tmp_path):
    stale = tmp_path / f".step-00000002.pt.{finished_process_id()}.0badf00d.tmp"
    stale.write_bytes(b"PK\x03\x04 the first half of a big archive")
    live = tmp_path / f".other.pt.{os.getpid()}.12345678.tmp"  # a writer still running: this one
    live.write_bytes(b"being written")
    unrelated = tmp_path / "notes.tmp"
    unrelated.write_bytes(b"not ours")
    save(model_file(), tmp_path / "step-00000003.pt")
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [live.name, unrelated.name, "step-00000003.pt"])


def test_average_refuses_a_checkpoint_with_non_finite_weights(tmp_path):
    good = save(model_file(), tmp_path / "a.pt")
    weights = export_weights(build("explicit", CONFIG, seed=1))
    weights["decoder.norm.bias"][2] = float("nan")
    bad = save(ModelFile(variant="explicit", config=CONFIG, settings={}, weights=weights), tmp_path / "b.pt")
    with pytest.raises(ValueError, match=rf"{bad} holds NaN or inf in 1 weights, first decoder\.norm\.bias"):
        average_files([good, bad])


def test_a_pickled_object_is_not_run(tmp_path):
    """The reader stays the safe one: a file whose pickle would call a function is refused."""
    path = tmp_path / "evil.pt"
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    path.write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ValueError, match="is not a readable checkpoint") as info:
        load(path)
    assert not marker.exists() and "weights_only" not in str(info.value)
