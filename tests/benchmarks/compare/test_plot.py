"""benchmarks.compare.plot: compare.py's picture (one panel per mode, a bar per variant, time relative to
torch with IQR whiskers), its path checks and the missing-extra message."""

from __future__ import annotations

import sys

import pytest

from benchmarks.compare.plot import EXTRA_HINT, matplotlib_problem, path_problem, plot, relative_times
from compare import main, parse_args

matplotlib = pytest.importorskip("matplotlib")


def row(variant: str, forward: float, train: float, tokens: float) -> dict:
    return {"variant": variant, "forward_ms": forward, "forward_iqr_ms": forward / 10,
            "train_ms": train, "train_iqr_ms": train / 20, "decode_tokens_per_s": tokens}


REPORT = {
    "meta": {"cpu_model": "Test CPU", "gpu_model": None, "threads": 2, "autocast": False,
             "compile": False, "preset": "tiny"},
    "blocks": [{"device": "cpu", "dtype": "float32", "batch": 4, "src_len": 16, "tgt_len": 16,
                "rows": [row("explicit", 2.0, 9.0, 100.0), row("fused", 1.0, 3.0, 400.0),
                         row("torch", 1.0, 6.0, 200.0)]}],
}


def test_times_are_relative_to_torch_with_half_the_iqr_as_whiskers():
    block = REPORT["blocks"][0]
    assert relative_times(block, "forward") == (["explicit", "fused", "torch"], [2.0, 1.0, 1.0],
                                                [0.1, 0.05, 0.05])
    assert relative_times(block, "train")[1] == [1.5, 0.5, 1.0]
    assert relative_times(block, "decode")[1:] == ([2.0, 0.5, 1.0], [0.0, 0.0, 0.0])  # time per id


def test_the_picture_decodes_and_is_not_blank(tmp_path):
    path = tmp_path / "compare.png"
    plot(REPORT, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(path)  # decodes, or raises
    height, width = pixels.shape[:2]
    assert width > 800 and height > 200
    assert pixels[..., :3].std() > 0.05  # bars and text, not one flat colour
    blue = (pixels[..., 2] > 0.6) & (pixels[..., 0] < 0.3)  # tab:blue bars
    assert blue.mean() > 0.01


def test_a_failed_or_missing_mode_has_no_bar():
    block = {**REPORT["blocks"][0], "rows": [{**r, "train_ms": None} if r["variant"] == "fused" else r
                                             for r in REPORT["blocks"][0]["rows"]]}
    assert relative_times(block, "train")[0] == ["explicit", "torch"]
    assert relative_times({**block, "rows": block["rows"][:2]}, "forward") == ([], [], [])  # no torch


@pytest.mark.parametrize("name, complaint", [
    ("out.jpg", "does not end in .png"), ("missing/out.png", "no directory"),
    ("adir.png", "is a directory")])
def test_bad_plot_paths_are_named(tmp_path, name, complaint):
    (tmp_path / "adir.png").mkdir()
    problem = path_problem(str(tmp_path / name))
    assert problem is not None and complaint in problem
    assert path_problem(str(tmp_path / "good.png")) is None


def test_missing_matplotlib_names_the_extra(monkeypatch):
    assert matplotlib_problem() is None
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    assert matplotlib_problem() == EXTRA_HINT
    assert "plot" in EXTRA_HINT and "extra" in EXTRA_HINT



# --- compare.py --plot ---------------------------------------------------------------------------


@pytest.mark.slow  # a compare.py run and a matplotlib draw (about 4 s)
def test_compare_draws_the_plot_it_is_asked_for(tmp_path, capsys):
    path = tmp_path / "run.png"
    assert main(["--preset", "tiny", "--rounds", "1", "--min-run-time", "0.02", "--threads", "1",
                 "--decode-len", "3", "--quiet", "--malloc", "default", "--variants", "fused", "torch",
                 "--plot", str(path)]) == 0
    assert "| fused" in capsys.readouterr().out  # the table still goes to stdout
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[1] > 800 and pixels[..., :3].std() > 0.05


@pytest.mark.parametrize("name, complaint", [
    ("out.jpg", "does not end in .png"), ("missing/out.png", "no directory"),
    ("adir.png", "is a directory")])
def test_compare_refuses_a_bad_plot_path_before_any_work(tmp_path, capsys, name, complaint):
    (tmp_path / "adir.png").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--preset", "tiny", "--plot", str(tmp_path / name)])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("compare.py: error: --plot") and complaint in line


def test_compare_without_matplotlib_exits_2_naming_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--preset", "tiny", "--plot", str(tmp_path / "run.png")])
    assert exit_info.value.code == 2
    assert "pip install -e '.[plot]'" in capsys.readouterr().err
