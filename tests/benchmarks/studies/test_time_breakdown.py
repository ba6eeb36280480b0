"""benchmarks.studies.time_breakdown: the table and the picture of where a train step's time goes, and
its refusals (a bad picture path, a device this machine lacks) before any profiling."""

from __future__ import annotations

import pytest
import torch

from benchmarks.studies.breakdown import GROUPS
from benchmarks.studies.time_breakdown import main, picture


def test_the_script_prints_a_table_with_the_coverage(capsys):
    assert main(["--variants", "fused", "--repeats", "1", "--threads", "1"]) == 0
    table = capsys.readouterr().out
    assert "covered %" in table and "| fused " in table


def test_the_picture_decodes_and_is_not_blank(tmp_path):
    import matplotlib.image

    shares = {v: (1e3, {g: 100 / len(GROUPS) for g in GROUPS}) for v in ("explicit", "torch")}
    path = tmp_path / "breakdown.png"
    picture({("float32", "eager"): shares, ("bfloat16", "compiled"): shares}, str(path), "title")
    pixels = matplotlib.image.imread(path)  # decodes, or raises
    assert pixels.std() > 0.05  # not blank


@pytest.mark.parametrize("out", ["breakdown.jpg", "no/such/dir/breakdown.png"])
def test_the_script_refuses_a_bad_picture_path_before_profiling(tmp_path, out, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--out", str(tmp_path / out)])
    assert stop.value.code == 2
    assert ".png" in capsys.readouterr().err  # the reason, not a traceback


def test_the_command_prints_its_help(capsys):
    """argparse %-formats every help string: a bare '%' in one breaks --help."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "--ms" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_one_line_naming_the_option(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--device", "cuda"])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("python -m benchmarks.studies.time_breakdown: error: "
                           "--device cuda: CUDA is not available")
