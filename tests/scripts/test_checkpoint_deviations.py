"""python -m scripts.checkpoint_deviations: the converted checkpoints agree with Hugging Face's
within the proofs' 1e-9, and each deviation planted back (a final norm, ReLU for swish, the
paper's positions, positions one row on, the start id masked or replaced, FSMT's cache path)
is caught: it moves the log-probs by far more."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("transformers", reason="the hf extra (pip install -e '.[hf]')")
pytest.importorskip("sacremoses", reason="the hf extra (pip install -e '.[hf]')")

from scripts import checkpoint_deviations


def test_each_deviation_is_caught_and_none_is_exact(capsys):
    checkpoint_deviations.main([])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()[2:]]
    measured = {(name.lstrip("| "), deviation): float(re.sub(r" \|$", "", value))
                for name, deviation, value in rows}
    assert len(measured) == sum(map(len, checkpoint_deviations.DEVIATIONS.values()))
    for (name, deviation), value in measured.items():
        if deviation == "none":
            assert value <= 1e-9, name
        elif deviation == "Hugging Face's float32 sinusoids":  # float32 rounding of positions, no more
            assert 1e-9 < value < 1e-4, name
        else:
            assert value > 1e-2, (name, deviation)
