"""The divergence finder (variants.check.divergence): a wrong probe map entry is found at its
point, points declared None are passed over, and the one-line verdict names the first point past
tolerance and how closely everything before it agrees; float32 on the path to a point is seen."""

from __future__ import annotations

import math
from typing import ClassVar

import pytest
import torch
from torch import Tensor, nn

from common.probes import probe_points, resolve_probes
from common.random_batch import random_batch
from tests.helpers import seeded, small_config
from variants.check.divergence import (
    Float32Watch,
    PointDifference,
    capture_watched,
    compare_points,
    first_divergence,
    float32_valued,
)
from variants.explicit.model import Transformer as Explicit


class Misprobed(Explicit):
    """explicit with its feed-forward points sent to the self-attention module."""

    probe_map: ClassVar[dict] = {**Explicit.probe_map,
                                 "{stack}.layers.{i}.ff": "{stack}.layers.{i}.self_attn"}


def test_a_wrong_probe_map_entry_is_found_at_that_point():
    config = small_config()
    model = Misprobed(config)
    model.load_state_dict(seeded("explicit", config).float().state_dict())
    inputs = random_batch(config).inputs()
    differences = compare_points(model.double().eval(), seeded("torch", config), inputs)
    assert first_divergence(differences, 1e-10).startswith("first divergence: encoder.layers.0.ff (max |Δ| ")


class Partial(Explicit):
    """explicit declaring no module for its norms: the finder passes over them."""

    probe_map: ClassVar[dict] = {**Explicit.probe_map, "{stack}.layers.{i}.norm1": None,
                                 "encoder.layers.{i}.norm2": None, "decoder.layers.{i}.norm2": None,
                                 "decoder.layers.{i}.norm3": None}


def test_points_declared_none_are_passed_over():
    config = small_config()
    model = Partial(config)
    model.load_state_dict(seeded("explicit", config).float().state_dict())
    inputs = random_batch(config).inputs()
    differences = compare_points(model.double().eval(), seeded("torch", config), inputs, ("partial", "torch"))
    notes = {d.point: d.note for d in differences if d.note}
    assert notes == {point: "not declared by partial" for point in probe_points(config) if ".norm" in point
                     and ".layers." in point}
    assert first_divergence(differences, 1e-10).startswith("no divergence: every point agrees to ")


def diffs(*values: float | None) -> list[PointDifference]:
    return [PointDifference(f"p{k}", value) for k, value in enumerate(values)]


@pytest.mark.parametrize(("differences", "line"), [
    (diffs(0.0, 3e-16, 0.41, 0.9),
     "first divergence: p2 (max |Δ| 0.41); everything before it agrees to 3e-16"),
    (diffs(0.5, 1e-16, 0.9), "first divergence: p0 (max |Δ| 0.5); nothing comes before it"),
    (diffs(1e-16, None, math.nan),
     "first divergence: p2 (max |Δ| nan); everything before it agrees to 1e-16"),
    (diffs(0.0, 2e-15, None), "no divergence: every point agrees to 2e-15 (tolerance 1e-10)"),
    ([PointDifference("a", 0.0), PointDifference("b", math.inf, "not computed by x"),
      PointDifference("c", 1.0)],
     "first divergence: b (not computed by x); everything before it agrees to 0"),
    ([PointDifference("a", None, "not declared by x"), PointDifference("b", 3.6)],
     "first divergence: b (max |Δ| 3.6); no point before it is probed"),
], ids=["middle", "first", "nan", "none", "not-computed", "none-probed-before"])
def test_first_divergence_names_the_first_point_past_tolerance(differences, line):
    assert first_divergence(differences, 1e-10) == line


def test_float32_on_the_path_is_seen_from_the_point_it_enters():
    """A float64 run has none; a norm whose input passes through float32 marks itself and every
    later point, the evidence that lets a difference there count as float32 rounding."""
    config = small_config(n_layers=1)
    model, inputs = seeded("explicit", config), random_batch(config).inputs()
    assert capture_watched(model, inputs)[1] == set()
    norm = model.get_submodule(resolve_probes(model)["decoder.norm"].module)
    norm.register_forward_pre_hook(lambda _module, args: (args[0].float().double(), *args[1:]))
    assert capture_watched(model, inputs)[1] == {"decoder.norm", "generator"}


@pytest.mark.parametrize(("values", "dtype", "expected"), [
    ([0.5, 0.25], torch.float64, True),   # float32 numbers, not all integers: a float32 table cast up
    ([0.1, 0.25], torch.float64, False),  # 0.1 in float64 is no float32 number
    ([1.0, 2.0], torch.float64, False),   # integers say nothing
    ([0.5, 0.25], torch.float32, False),  # float32 itself is seen by its dtype, not here
])
def test_a_float32_valued_buffer_is_recognised(values, dtype, expected):
    assert float32_valued(torch.tensor(values, dtype=dtype)) is expected


class Table(nn.Module):
    """One lookup in a table: a frozen parameter (Hugging Face's sinusoid tables are), or one that
    trains (every canonical weight, drawn in float32 and cast up like the table)."""

    def __init__(self, frozen: bool) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.rand(4, 3).double(), requires_grad=not frozen)  # float32 values

    def forward(self, ids: Tensor) -> Tensor:
        return self.table[ids] * 2


@pytest.mark.parametrize("frozen", [True, False])
def test_a_frozen_parameter_holding_float32_values_is_float32_evidence(frozen):
    model = Table(frozen)
    with Float32Watch(model) as watch:
        model(torch.tensor([0, 2]))
    assert watch.seen is frozen
    assert watch.source.startswith("frozen parameter table holds float32 values") is frozen
