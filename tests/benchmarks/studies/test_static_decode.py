"""benchmarks.studies.static_decode: a row per decoder with the same tokens as the growing cache's greedy,
and the GPU script's command accepted as written."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch

from benchmarks.studies.static_decode import main, parse
from seq2seq.fast.flat import FlatDecoding

ROOT = Path(__file__).resolve().parents[3]


def test_a_row_per_decoder_each_with_the_baselines_tokens(capsys):
    assert main(["--device", "cpu", "--preset", "tiny", "--batch", "2", "--src-len", "4", "--max-len", "4",
                 "--modes", "eager", "--min-run-time", "0.01"]) == 0
    rows = re.findall(r"^\| (.+?) +\|.*\| (yes|no) +\|$", capsys.readouterr().out, flags=re.M)
    assert rows == [("greedy_decode (growing cache)", "yes"), ("static greedy, eager", "yes")]


def test_each_lever_is_a_row_and_each_search_has_its_baseline(capsys, monkeypatch):
    """Beam rows against beam_search's hypotheses, greedy rows against greedy_decode's tokens
    (eager only: --freezing, a compile option, is refused with it, below); the flat rows step
    through the flat step."""
    flat_steps = []
    step = FlatDecoding.static_step
    monkeypatch.setattr(FlatDecoding, "static_step",
                        lambda self, *args: flat_steps.append(1) or step(self, *args))
    assert main(["--device", "cpu", "--preset", "tiny", "--batch", "2", "--src-len", "4", "--max-len", "4",
                 "--modes", "eager", "--search", "greedy", "beam", "--log-probs", "--onednn", "--flat",
                 "--min-run-time", "0.01"]) == 0
    rows = re.findall(r"^\| (.+?) +\|.*\| (yes|no) +\|$", capsys.readouterr().out, flags=re.M)
    assert rows == [("greedy_decode (growing cache)", "yes"), ("static greedy, eager", "yes"),
                    ("static greedy, eager, argmax of log-probs", "yes"),
                    ("static greedy, eager, oneDNN", "yes"),
                    ("static greedy, eager, oneDNN, argmax of log-probs", "yes"),
                    ("static greedy, eager, flat", "yes"),
                    ("static greedy, eager, flat, argmax of log-probs", "yes"),
                    ("static greedy, eager, oneDNN, flat", "yes"),
                    ("static greedy, eager, oneDNN, flat, argmax of log-probs", "yes"),
                    ("beam_search (growing cache)", "yes"), ("static beam, eager", "yes"),
                    ("static beam, eager, oneDNN", "yes"), ("static beam, eager, flat", "yes"),
                    ("static beam, eager, oneDNN, flat", "yes")]
    assert flat_steps


def test_the_gpu_scripts_command_is_accepted(monkeypatch):
    """scripts/gpu_check.sh runs only on a lent GPU: a rejected option there costs the lease."""
    script = (ROOT / "scripts" / "gpu_check.sh").read_text().replace("\\\n", " ")
    (line,) = [line for line in script.splitlines() if "-m benchmarks.studies.static_decode" in line]
    words = shlex.split(line)
    options = [word for word in words[words.index("benchmarks.studies.static_decode") + 1:]
               if not word.startswith(">") and not word.endswith("2>&1")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    settings = parse(options)
    assert (settings.device.type, settings.modes) == ("cuda", ("eager", "reduce-overhead"))
    assert settings.searches == ("greedy", "beam")


def test_a_length_past_max_seq_len_is_refused(capsys):
    with pytest.raises(SystemExit) as stop:
        parse(["--device", "cpu", "--preset", "tiny", "--max-len", "129"])
    assert stop.value.code == 2
    assert "--max-len must lie in [2, max_seq_len=128]" in capsys.readouterr().err


def test_onednn_is_refused_off_cpu_float32(capsys):
    with pytest.raises(SystemExit) as stop:
        parse(["--device", "cpu", "--preset", "tiny", "--dtype", "bfloat16", "--onednn"])
    assert stop.value.code == 2
    assert "--onednn is a CPU float32 lever, got --device cpu --dtype bfloat16" in capsys.readouterr().err


@pytest.mark.parametrize(("options", "message", "got"), [
    (["--modes", "eager", "--freezing"], "--freezing applies to compiled modes only", "got --modes eager"),
    (["--modes", "default", "--flat"], "--flat applies to eager rows only", "got --modes default"),
], ids=["freezing-eager-only", "flat-compiled-only"])
def test_a_lever_without_the_rows_it_applies_to_is_refused(capsys, options, message, got):
    """--freezing freezes compiled modes only, and the flat step runs eagerly: either alone with
    the other kind of rows would change nothing."""
    with pytest.raises(SystemExit) as stop:
        parse(["--device", "cpu", "--preset", "tiny", *options])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert message in line and got in line, line


def test_the_levers_are_accepted_with_their_rows():
    settings = parse(["--device", "cpu", "--preset", "tiny", "--modes", "eager", "default",
                      "--freezing", "--flat"])
    assert settings.freezing and settings.flat and settings.modes == ("eager", "default")
