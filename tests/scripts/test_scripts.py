"""The scripts' own machinery: the deviations table's fill-value swap measures what it says, the
trace of a forward pass, and the GPU script's commands."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import torch
from torch import nn

from scripts import deviations, trace

ROOT = Path(__file__).resolve().parents[2]


class UnmaskedModel(nn.Module):
    """Uniform log-probs of the right shape, and no masked fill anywhere."""

    config = deviations.CONFIG

    def forward(self, src, tgt, src_mask, tgt_mask):
        return torch.zeros(*tgt.shape, self.config.tgt_vocab_size).log_softmax(-1)


def test_a_source_fill_value_reaches_the_models_masked_scores():
    model = deviations.baseline()
    reference = deviations.log_probs(model)
    with deviations.FillMaskedScoresWith(float("-inf")) as fill:
        every_row_has_a_key = deviations.log_probs(model)
    assert fill.filled > 0
    torch.testing.assert_close(every_row_has_a_key, reference, atol=0.0, rtol=0.0)

    empty = deviations.filled_with(float("-inf"), model)  # an all-padding source: softmax of -infs
    not_finite = ~torch.isfinite(empty).all(dim=-1)  # (B, T)
    assert not_finite[deviations.EMPTY_SOURCE_ROW].all()
    not_finite[deviations.EMPTY_SOURCE_ROW] = False
    assert not not_finite.any()


def test_a_model_that_fills_no_scores_is_refused():
    with pytest.raises(RuntimeError, match="filled no masked scores"):
        deviations.filled_with(float("-inf"), UnmaskedModel())


def test_trace_shows_each_module_with_the_shape_it_returned(variant, capsys):
    assert trace.main(["--variant", variant, "--depth", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{variant}: B=2, S=5, T=4")
    assert len(lines) > 2 and all(" -> " in line for line in lines[1:])


def test_trace_refuses_a_depth_below_one(capsys):
    with pytest.raises(SystemExit) as exit_info:
        trace.main(["--depth", "0"])
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_every_compare_command_in_the_gpu_script_is_accepted(monkeypatch):
    """scripts/gpu_check.sh runs only on a lent GPU: a rejected option there costs the lease."""
    from compare import parse_args

    script = (ROOT / "scripts" / "gpu_check.sh").read_text().replace("\\\n", " ")
    commands = [shlex.split(line)[line.split().index("compare.py") + 1:]
                for line in script.splitlines() if "compare.py --" in line]
    assert len(commands) == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    every_decoder = []
    for command in commands:
        options = [word.replace("$OUT", "/tmp") for word in command
                   if not word.startswith(">") and not word.endswith("2>&1")]
        settings, _ = parse_args(options)
        assert settings.devices == ("cuda",)
        every_decoder.append(settings.all_decoders)
    assert settings.config.max_seq_len == 2048 and max(s.src_len for s in settings.shapes) == 2048
    assert every_decoder == [True, False]  # the base run times every decoder; the long one none


def test_the_gpu_script_runs_modules_and_files_that_exist():
    """The measuring programs run as modules of benchmarks/ (not of scripts/, where they lived),
    and every module and pytest file the script names is there."""
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    modules = re.findall(r"\"\$PYTHON\" -m ([\w.]+)", script)
    assert {"benchmarks.studies.time_breakdown", "benchmarks.studies.static_decode"} <= set(modules)
    assert [module for module in modules if importlib.util.find_spec(module) is None] == []
    paths = re.findall(r"pytest (\S+\.py)", script)
    assert paths and [path for path in paths if not (ROOT / path).is_file()] == []
    assert not re.search(r"\bissues? \d", script)  # a reader's comments, not a tracker's

