"""A training run killed (SIGKILL) in the middle of writing a checkpoint loses nothing but the
steps since its last complete one: the resumed run continues from there, ends with the weights
of a run never interrupted, and its next save removes the dead run's temporary file."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from seq2seq import train as train_cli
from seq2seq.storage.model_file import load_checkpoint
from seq2seq.training.run import checkpoint_path, list_checkpoints

ROOT = Path(__file__).resolve().parents[3]
OPTIONS = ["--variant", "explicit", "--task", "copy", "--batch", "4", "--d-model", "16", "--heads", "2",
           "--layers", "1", "--d-ff", "16", "--dropout", "0.1", "--vocab", "9", "--max-len", "5",
           "--warmup", "3", "--eval-size", "4", "--steps", "6", "--save-every", "2"]

# The training command, but the process kills itself once the temporary file of the step-4
# checkpoint is written and flushed to disk, before it is renamed into place: the worst moment.
KILLED_MID_SAVE = """
import os, signal, sys
flush_to_disk = os.fsync
def fsync_then_die(fd):
    flush_to_disk(fd)
    name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
    if name.startswith(".step-00000004.pt.") and name.endswith(".tmp"):
        os.kill(os.getpid(), signal.SIGKILL)
os.fsync = fsync_then_die
from seq2seq.train import main
main(sys.argv[1:])
"""


def train_in_process(directory: Path, *more: str, monkeypatch) -> None:
    monkeypatch.setattr("sys.stderr", io.StringIO())  # the progress bar
    train_cli.main([*OPTIONS, "--checkpoint-dir", str(directory), *more])


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="finds the file being written in /proc")
def test_a_run_killed_mid_save_resumes_to_the_uninterrupted_weights(tmp_path, monkeypatch, capsys):
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_SAVE, *OPTIONS, "--threads", "1",
                             "--checkpoint-dir", str(tmp_path / "killed")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = sorted(path.name for path in (tmp_path / "killed").iterdir())
    assert [name for name in left if not name.endswith(".tmp")] == ["step-00000002.pt"]
    temporary = [path for path in (tmp_path / "killed").iterdir() if path.name.endswith(".tmp")]
    assert len(temporary) == 1 and temporary[0].name.startswith(".step-00000004.pt.")
    assert temporary[0].stat().st_size > (tmp_path / "killed" / "step-00000002.pt").stat().st_size // 2

    # the test session runs torch on one thread (tests/conftest.py), as the killed run did
    train_in_process(tmp_path / "killed", "--resume", monkeypatch=monkeypatch)
    train_in_process(tmp_path / "straight", monkeypatch=monkeypatch)
    capsys.readouterr()

    assert not temporary[0].exists()
    assert [path.name for path in list_checkpoints(tmp_path / "killed")] == [
        "step-00000002.pt", "step-00000004.pt", "step-00000006.pt"]
    assert not [path for path in (tmp_path / "killed").iterdir() if path.name.endswith(".tmp")]
    resumed, straight = (load_checkpoint(checkpoint_path(tmp_path / run, 6))
                         for run in ("killed", "straight"))
    for name, tensor in straight.weights.items():
        difference = (resumed.weights[name].double() - tensor.double()).abs().max().item()
        assert difference <= 1e-12, (name, difference)
