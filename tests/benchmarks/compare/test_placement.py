"""Where each row's weights lie, drawn anew before every round (benchmarks.compare.placement): every
parameter and buffer moves to fresh memory, the model still computes the same log-probs, and a
run does it between rounds unless told not to. No timing is asserted: the mechanism is."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import benchmarks.compare.run
from benchmarks.compare.placement import Placement, replace_tensors
from benchmarks.compare.run import CONTROL, Block, build_rows, time_rounds
from common.config import TransformerConfig
from common.random_batch import random_batch
from compare import parse_args
from tests.benchmarks.compare.test_compare import tiny_settings
from tests.benchmarks.compare.test_ratios import FakePeak
from variants import REFERENCE, build

BATCH = dict(batch=2, src_len=8, tgt_len=6)


def addresses(model: nn.Module) -> set[int]:
    """Where each of the model's parameters and buffers starts."""
    return {tensor.data_ptr() for tensor in (*model.parameters(), *model.buffers())}


def log_probs(model: nn.Module, config: TransformerConfig) -> torch.Tensor:
    """Eval log-probs on the fixed batch every test here uses."""
    batch = random_batch(config, *BATCH.values(), seed=0)
    with torch.no_grad():
        return model.eval()(*batch.inputs())


@pytest.mark.parametrize("name", ["explicit", REFERENCE])
def test_every_tensor_moves_and_the_log_probs_stay_those_of_a_model_never_moved(name):
    """Three re-placings: each moves every parameter and buffer off the addresses it had (all
    the new storage is allocated while the old is alive), and the log-probs equal, bit for bit,
    those of the same model built apart and never re-placed (the expected values)."""
    config = tiny_settings().config
    model, untouched = build(name, config, seed=0), build(name, config, seed=0)
    expected = log_probs(untouched, config)
    placement = Placement(seed=0)
    for _ in range(3):
        before = addresses(model)
        placement.replace([model])
        assert not addresses(model) & before
        assert torch.equal(log_probs(model, config), expected)


def test_tied_weights_stay_tied_and_buffers_stay_registered():
    """With shared embeddings one matrix serves the source and target embeddings and the
    generator: after re-placing, the names that shared storage still share it (one new copy),
    and the positional table is still a buffer of its module, at a new address."""
    config = tiny_settings().config
    config = config.replace(share_embeddings=True, tgt_vocab_size=config.src_vocab_size)
    model = build("explicit", config, seed=0)

    def shared_groups() -> set[frozenset[str]]:
        by_address: dict[int, set[str]] = {}
        for label, tensor in model.named_parameters(remove_duplicate=False):
            by_address.setdefault(tensor.data_ptr(), set()).add(label)
        return {frozenset(group) for group in by_address.values()}

    groups, buffers = shared_groups(), dict(model.named_buffers())
    assert any(len(group) > 1 for group in groups)  # the test has a tie to keep
    replace_tensors(model)
    assert shared_groups() == groups
    moved = dict(model.named_buffers())
    assert moved.keys() == buffers.keys()
    assert all(moved[key].data_ptr() != buffers[key].data_ptr() and torch.equal(moved[key], buffers[key])
               for key in buffers)


def rounds_of_addresses(monkeypatch, replace_weights: bool) -> tuple[dict, dict, dict]:
    """time_rounds over the tiny rows (explicit, torch, the control) with nothing timed: each
    round's addresses of every row's tensors, as its first cell finds them; the rows' models;
    the rounds' record."""
    settings = tiny_settings(variants=("explicit", REFERENCE), rounds=4, replace_weights=replace_weights)
    block = Block("cpu", "float32", settings.shapes[0], batch=None, autocast=None)
    rows = build_rows(settings, block)
    seen: dict[str, list[set[int]]] = {row.variant: [] for row in rows}

    def cell(row, mode, *_):
        if mode == settings.modes[0]:
            seen[row.variant].append(addresses(row.model))

    monkeypatch.setattr(benchmarks.compare.run, "MatmulPeak", FakePeak)
    monkeypatch.setattr(benchmarks.compare.run, "time_cell", cell)
    _, record = time_rounds(rows, settings, block, bar=benchmarks.compare.run.tqdm(disable=True))
    return seen, {row.variant: row.model for row in rows}, record


def test_a_run_re_places_every_rows_weights_before_each_round(monkeypatch):
    """Every row's addresses change from each round to the next (so where its weights lie varies
    inside the intervals), and every model still gives the log-probs of one built apart and
    never moved; the record keeps what each re-placing cost."""
    seen, models, record = rounds_of_addresses(monkeypatch, replace_weights=True)
    assert len(record["replace_s"]) == 4 and all(seconds >= 0 for seconds in record["replace_s"])
    config = tiny_settings().config
    expected = {name: log_probs(build(name, config, seed=0), config) for name in ("explicit", REFERENCE)}
    for variant, rounds in seen.items():
        assert len(rounds) == 4
        assert all(not now & before for before, now in itertools.pairwise(rounds)), variant
        reference = expected[REFERENCE if variant in (REFERENCE, CONTROL) else variant]
        assert torch.equal(log_probs(models[variant], config), reference), variant


def test_without_re_placing_the_weights_stay_put(monkeypatch):
    seen, _, record = rounds_of_addresses(monkeypatch, replace_weights=False)
    assert record["replace_s"] == []
    for variant, rounds in seen.items():
        assert all(now == rounds[0] for now in rounds), variant


def test_the_option_is_on_by_default_off_when_asked_and_off_under_compile():
    """--compile keeps the weights where they are: its compiled graphs hold them."""
    assert parse_args(["--preset", "tiny"])[0].replacing
    assert not parse_args(["--preset", "tiny", "--no-replace-weights"])[0].replacing
    assert parse_args(["--preset", "tiny", "--replace-weights"])[0].replacing
    compiled = parse_args(["--preset", "tiny", "--compile"])[0]
    assert compiled.replace_weights and not compiled.replacing


def test_the_spacers_come_from_the_seed(monkeypatch):
    """A report repeats: the same seed draws the same gaps, another seed others."""
    models = [nn.Linear(2, 2), None, nn.Linear(2, 2)]
    original, drawn = torch.empty, []
    monkeypatch.setattr(torch, "empty", lambda size, *args, **kwargs: drawn.append(size) or original(
        size, *args, **kwargs))
    sizes = []
    for seed in (0, 0, 1):
        drawn.clear()
        Placement(seed).replace(models)
        sizes.append(list(drawn))
    assert len(sizes[0]) == 2 and sizes[0] == sizes[1] != sizes[2]
