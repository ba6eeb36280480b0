"""scripts.decode_scan: one interleaved run gives the cache's speed-up at every length."""

from __future__ import annotations

import re

import pytest

from scripts.decode_scan import main

TINY = ["--preset", "tiny", "--batch", "2", "--src-len", "4", "--threads", "1"]


def test_a_row_per_power_of_two_plus_one_and_the_last_length(capsys):
    assert main([*TINY, "--max-len", "6", "--target", "0.01"]) == 0
    out = capsys.readouterr().out
    lengths = [int(n) for n in re.findall(r"^\| (\d+) ", out, flags=re.M)]
    assert lengths == [2, 3, 5, 6]
    assert "speed-up first >= 0.01x at L = 2 ids" in out  # any run beats a hundredth at once


def test_an_unreachable_target_is_reported_as_such(capsys):
    assert main([*TINY, "--max-len", "3", "--target", "1e9"]) == 0
    assert "speed-up below 1e+09x up to L = 3 ids" in capsys.readouterr().out


def test_a_length_past_max_seq_len_is_refused_before_any_model_is_built(capsys):
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--max-len", "129"])  # the tiny preset's max_seq_len is 128
    assert stop.value.code == 2
    assert "--max-len must lie in [2, max_seq_len=128]" in capsys.readouterr().err


def test_ops_counts_the_kernel_running_operators_of_a_cached_step_per_variant(capsys):
    assert main([*TINY, "--ops"]) == 0
    counts = dict(re.findall(r"^\| (\w+) +\| +(\d+) \|$", capsys.readouterr().out, flags=re.M))
    assert set(counts) == {"explicit", "einsum", "mathfirst", "fused"}
    assert all(int(n) > 0 for n in counts.values())
