"""benchmarks.breakdown: a profiled train step's self time in groups that add up to the whole."""

from __future__ import annotations

import pytest

from benchmarks.breakdown import GROUPS, group_of, profile_train_step
from common.batches import random_batch
from common.config import TransformerConfig
from variants import build

CONFIG = TransformerConfig(d_model=32, n_heads=4, n_layers=1, d_ff=64, src_vocab_size=40,
                           tgt_vocab_size=40, max_seq_len=16)


@pytest.mark.parametrize("variant", ["explicit", "torch"])
def test_the_groups_sum_to_the_profiled_total(variant):
    groups, total = profile_train_step(build(variant, CONFIG, seed=0), random_batch(CONFIG, 2, 6, 5))
    assert list(groups) == list(GROUPS)
    assert total > 0
    assert sum(groups.values()) == pytest.approx(total, rel=1e-6)  # self times partition the total
    for group in ("matmul", "optimizer", "embedding/generator", "dropout"):
        assert groups[group] > 0, group


def test_operators_are_grouped_by_name():
    assert group_of("aten::addmm") == "matmul"
    assert group_of("aten::_softmax_backward_data") == "attention"
    assert group_of("aten::native_layer_norm_backward") == "layernorm"
    assert group_of("aten::native_dropout") == "dropout"
    assert group_of("aten::embedding_dense_backward") == "embedding/generator"
    assert group_of("aten::threshold_backward") == "elementwise"
    assert group_of("aten::view") == "other"


@pytest.mark.parametrize("out", ["breakdown.jpg", "no/such/dir/breakdown.png"])
def test_the_script_refuses_a_bad_picture_path_before_profiling(tmp_path, out, capsys):
    from benchmarks.time_breakdown import main

    with pytest.raises(SystemExit) as stop:
        main(["--out", str(tmp_path / out)])
    assert stop.value.code == 2
    assert ".png" in capsys.readouterr().err  # the reason, not a traceback
