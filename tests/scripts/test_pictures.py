"""`python -m scripts.pictures` writes real pictures, and says which extra it needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scripts import pictures

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
COMMAND = [sys.executable, "-m", "scripts.pictures"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*COMMAND, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # the pictures' data is checked by test_pictures_data.py; this draws the PNGs
def test_writes_both_pictures(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    out = tmp_path / "new" / "pictures"  # created by the command
    result = run("--out", str(out), "--d-model", "64", "--max-len", "50", "--heads", "4", "--layer", "1")
    assert result.returncode == 0, result.stderr
    for name in ("positional_encoding.png", "attention_weights.png"):
        path = out / name
        assert path.is_file(), name
        assert path.read_bytes()[:8] == PNG_SIGNATURE, name
        pixels = imread(path)[..., :3]  # (height, width, RGB) in [0, 1]
        assert pixels.std() > 0.05, f"{name} is blank"
        # the heatmaps are drawn in colour maps; axes, ticks and titles are grey
        colourful = (pixels.max(-1) - pixels.min(-1)) > 0.2
        assert colourful.mean() > 0.2, f"{name} has no heatmap"


def test_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # None makes `import matplotlib` fail
    with pytest.raises(SystemExit) as exit_info:
        pictures.main(["--out", str(tmp_path)])
    message = exit_info.value.code  # sys.exit(str) prints it to stderr and exits with status 1
    assert isinstance(message, str) and len(message.splitlines()) == 1
    assert 'pip install -e ".[plot]"' in message
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("bad", [["--layer", "2"], ["--d-model", "30", "--heads", "4"],
                                 ["--tokens", "5", "1000"], ["--max-len", "0"]])
def test_bad_options_are_refused(tmp_path, bad, capsys):
    with pytest.raises(SystemExit) as exit_info:
        pictures.main(["--out", str(tmp_path), *bad])
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("where", ["file", "under-file"])
def test_pictures_refuse_an_out_they_cannot_write_before_any_work(tmp_path, capsys, monkeypatch, where):
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" if where == "file" else tmp_path / "file" / "pictures"
    monkeypatch.setattr(pictures, "translation_pictures", lambda args: pytest.fail("worked first"))
    with pytest.raises(SystemExit) as stop:
        pictures.main(["--translation", str(tmp_path / "model.pt"), "--sentences", "Hi.", "--out", str(out)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--out" in err and "is a file, not a directory" in err, err
