"""Restoring a checkpoint is all or nothing: a checkpoint with a bad part anywhere (Adam, the
schedule, the RNG, the batch stream) is refused with a ValueError naming it, and the run is left
exactly as it was: weights, Adam, step, RNG and batch stream."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from common.config import TransformerConfig
from common.weights import export_weights
from seq2seq.data.tasks import task_batches
from seq2seq.storage.model_file import Checkpoint
from seq2seq.training.recipe import Recipe
from seq2seq.training.trainer import Trainer
from variants import build

CONFIG = TransformerConfig(d_model=16, n_heads=2, n_layers=1, d_ff=16, dropout=0.1,
                           src_vocab_size=9, tgt_vocab_size=9, max_seq_len=8)


def trainer(steps: int, seed: int) -> Trainer:
    """A run of ``steps`` steps (Adam has state, the streams have moved)."""
    torch.manual_seed(seed)
    run = Trainer(build("explicit", CONFIG, seed=seed),
                  task_batches("copy", 4, vocab_size=9, min_len=1, max_len=5, seed=0), Recipe(warmup=3))
    run.run(steps)
    return run


def snapshot(run: Trainer) -> dict[str, object]:
    """Everything a restore may change, copied."""
    return {"weights": {k: v.clone() for k, v in run.model.state_dict().items()},
            "optimizer": _copy(run.optimizer.state_dict()), "scheduler": _copy(run.scheduler.state_dict()),
            "step": run.step, "rng": torch.get_rng_state(), "data_rng": run.batches.generator.get_state()}


def _copy(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy(item) for item in value)
    return value


def same(a, b) -> bool:
    """Equal, tensors bit for bit, through nested dicts, lists and tuples."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b


def with_moment(optimizer: dict, index: int, name: str, tensor: torch.Tensor) -> dict:
    state = {**optimizer["state"], index: {**optimizer["state"][index], name: tensor}}
    return {**optimizer, "state": state}


def damaged(checkpoint: Checkpoint, case: str) -> Checkpoint:
    """``checkpoint`` with one part broken, as a file written by other code (or edited) could be."""
    optimizer, scheduler = checkpoint.optimizer, checkpoint.scheduler
    exp_avg = optimizer["state"][0]["exp_avg"]
    changes = {
        "moment-shape": dict(optimizer=with_moment(optimizer, 0, "exp_avg", exp_avg[:-1])),
        "moment-nan": dict(optimizer=with_moment(optimizer, 0, "exp_avg", exp_avg * float("nan"))),
        "moment-of-no-parameter": dict(optimizer={**optimizer, "state": {**optimizer["state"], 999: {}}}),
        "no-param-groups": dict(optimizer={"state": optimizer["state"]}),
        "param-groups-size": dict(optimizer={**optimizer, "param_groups": []}),
        "schedule-step": dict(scheduler={**scheduler, "last_epoch": checkpoint.step + 5}),
        "schedule-field": dict(scheduler={k: v for k, v in scheduler.items() if k != "base_lrs"}),
        "rng-size": dict(rng=({"cpu": torch.zeros(10, dtype=torch.uint8), "cuda": None},)),
        "rng-dtype": dict(rng=({"cpu": checkpoint.rng[0]["cpu"].float(), "cuda": None},)),
        "data-rng": dict(data_rng=checkpoint.data_rng[:100]),
    }[case]
    return dataclasses.replace(checkpoint, **changes)


CASES = {  # case -> what the message names
    "moment-shape": r"optimizer\.state\[0\]\['exp_avg'\]: shape \(8, 16\), its parameter has \(9, 16\)",
    "moment-nan": r"optimizer\.state\[0\]\['exp_avg'\]: holds NaN or inf",
    "moment-of-no-parameter": r"optimizer\.state: entry 999 names no parameter",
    "no-param-groups": r"optimizer: expected Adam's state_dict",
    "param-groups-size": r"optimizer\.param_groups: \[\] parameters per group, this run has \[\d+\]",
    "schedule-step": r"scheduler\.last_epoch: 8, but the checkpoint is at step 3",
    "schedule-field": r"scheduler: missing field base_lrs",
    "rng-size": r"rng cpu: not a generator state",
    "rng-dtype": r"rng cpu: not a generator state",
    "data-rng": r"data_rng: not a generator state",
}


@pytest.fixture(scope="module")
def good_checkpoint() -> Checkpoint:
    return trainer(3, seed=0).checkpoint("explicit")


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_part_is_refused_and_nothing_changes(case, good_checkpoint):
    run = trainer(1, seed=1)  # another run's state, so that a partial restore would show
    before = snapshot(run)
    with pytest.raises(ValueError, match=r"checkpoint cannot be restored:\n.*" + CASES[case]):
        run.restore(damaged(good_checkpoint, case), "explicit")
    after = snapshot(run)
    assert [part for part in before if not same(before[part], after[part])] == []


def test_after_a_refusal_the_good_checkpoint_restores_whole(good_checkpoint):
    run = trainer(1, seed=1)
    with pytest.raises(ValueError):
        run.restore(damaged(good_checkpoint, "rng-size"), "explicit")
    run.restore(good_checkpoint, "explicit")
    assert run.step == good_checkpoint.step
    assert same(export_weights(run.model), good_checkpoint.weights)
    assert same(run.optimizer.state_dict()["state"], good_checkpoint.optimizer["state"])
    assert same(torch.get_rng_state(), good_checkpoint.rng[0]["cpu"])
    assert same(run.batches.generator.get_state(), good_checkpoint.data_rng)
