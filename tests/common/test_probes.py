"""Probe maps: every built-in declares every point, its hooks fire in the order of computation,
and every pair of built-ins agrees at every point. The finder's tests are the checker's
(tests/variants/check/test_divergence.py)."""

from __future__ import annotations

import itertools
import math
from typing import ClassVar

import pytest
import torch

from common.probes import Probe, capture, probe_points, resolve_probes
from common.random_batch import random_batch
from tests.helpers import FLOAT64_TOL, seeded, small_config
from variants import VARIANTS
from variants.explicit.model import Transformer as Explicit

NORMS = pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])


def test_points_in_order_of_computation():
    post = probe_points(small_config(n_layers=1))
    assert post == ["src_embed", "encoder.layers.0.self_attn", "encoder.layers.0.norm1",
                    "encoder.layers.0.ff", "encoder.layers.0.norm2", "encoder.layers.0", "encoder.norm",
                    "tgt_embed", "decoder.layers.0.self_attn", "decoder.layers.0.norm1",
                    "decoder.layers.0.cross_attn", "decoder.layers.0.norm2", "decoder.layers.0.ff",
                    "decoder.layers.0.norm3", "decoder.layers.0", "decoder.norm", "generator"]
    pre = probe_points(small_config(n_layers=1, norm_first=True))
    assert pre[1:5] == ["encoder.layers.0.norm1", "encoder.layers.0.self_attn",
                        "encoder.layers.0.norm2", "encoder.layers.0.ff"]
    assert sorted(pre) == sorted(post)
    assert len(probe_points(small_config(n_layers=3))) == 1 + 3 * 5 + 2 + 3 * 7 + 2


@NORMS
def test_every_builtin_declares_every_point_and_computes_them_in_order(variant, norm_first):
    config = small_config(norm_first=norm_first)
    model = seeded(variant, config)
    assert all(probe is not None for probe in resolve_probes(model).values())
    batch = random_batch(config, 3, 7, 5)
    values = capture(model, batch.inputs())
    assert list(values) == probe_points(config)  # every point, once each, in this order
    for point, value in values.items():
        length = 7 if point.startswith(("src", "encoder")) else 5
        width = config.tgt_vocab_size if point == "generator" else config.d_model
        assert value.shape == (3, length, width), point


@NORMS
def test_every_pair_of_builtins_agrees_at_every_point(norm_first):
    """float64, a padded batch with S != T: the definitions of the points are the same in all five."""
    config = small_config(norm_first=norm_first)
    inputs = random_batch(config, 3, 7, 5).inputs()
    values = {name: capture(seeded(name, config), inputs) for name in VARIANTS}
    for a, b in itertools.combinations(VARIANTS, 2):
        for point in probe_points(config):
            torch.testing.assert_close(values[a][point], values[b][point], **FLOAT64_TOL,
                                       msg=lambda m, a=a, b=b, p=point: f"{a} vs {b} at {p}: {m}")


class FastPathSpy(Explicit):
    """explicit, noting whether nn.MultiheadAttention's fast path is on while it runs."""

    fast_path: ClassVar[list[bool]] = []

    def forward(self, *inputs):
        self.fast_path.append(torch.backends.mha.get_fastpath_enabled())
        return super().forward(*inputs)


def test_capture_turns_the_fast_path_off_and_restores_it_and_its_hooks():
    """nn.Transformer's eval fast path can run whole layers without calling their submodules
    (torch 2.13's layers also leave it when hooks are attached; capture does not rely on that)."""
    config = small_config()
    model = seeded("torch", config).float()
    assert torch.backends.mha.get_fastpath_enabled()
    values = capture(model, random_batch(config).inputs())
    assert list(values) == probe_points(config)
    assert torch.backends.mha.get_fastpath_enabled()
    assert not any(module._forward_hooks for module in model.modules())
    capture(FastPathSpy(config).eval(), random_batch(config).inputs())
    assert FastPathSpy.fast_path == [False] and torch.backends.mha.get_fastpath_enabled()


def test_capture_runs_inside_during_and_names_each_point_as_it_is_captured():
    """The two hooks the checker's finder watches float32 through (variants.check.divergence)."""
    config = small_config(n_layers=1)
    entered, named = [], []

    class During:
        def __enter__(self):
            entered.append(torch.is_grad_enabled())

        def __exit__(self, *_):
            entered.append("exit")

    values = capture(seeded("explicit", config), random_batch(config).inputs(), during=During(),
                     on_point=named.append)
    assert entered == [False, "exit"] and named == list(values) == probe_points(config)


def test_a_module_used_twice_is_probed_at_the_call_named():
    """The reference's one dropout runs after both embeddings: call 0 is the source's."""
    config = small_config()
    model = seeded("torch", config)
    src, tgt, src_mask, tgt_mask = random_batch(config, 2, 6, 3).inputs()
    values = capture(model, (src, tgt, src_mask, tgt_mask))
    scale = math.sqrt(config.d_model)
    expected = model.src_embed(src) * scale + model.pe[:6]
    torch.testing.assert_close(values["src_embed"], expected, **FLOAT64_TOL)
    assert values["tgt_embed"].shape == (2, 3, config.d_model)


class Unmapped(Explicit):
    probe_map: ClassVar[dict] = {}


class Misspelt(Explicit):
    probe_map: ClassVar[dict] = {**Explicit.probe_map, "{stack}.layers.{i}.selfattn": "x",
                                 "generator": Probe("projection.linear.nosuch")}


class Ambiguous(Explicit):
    probe_map: ClassVar[dict] = {**Explicit.probe_map, "{stack}.layers.{i}.{sublayer}": "x"}


@pytest.mark.parametrize(("cls", "messages"), [
    (type("NoMap", (Explicit,), {"probe_map": None}), ["NoMap declares no probe_map"]),
    (Unmapped, ["Unmapped.probe_map does not cover 29 probe points: src_embed, encoder.layers.0.self_attn"]),
    (Misspelt, ["entry '{stack}.layers.{i}.selfattn' matches no probe point",
                "sends generator to 'projection.linear.nosuch', which the model lacks"]),
    (Ambiguous, ["entries '{stack}.layers.{i}.self_attn' and '{stack}.layers.{i}.{sublayer}' all match "
                 "encoder.layers.0.self_attn (and 3 more like it)"]),
], ids=["none", "empty", "misspelt", "ambiguous"])
def test_a_bad_probe_map_names_every_problem_in_one_line(cls, messages):
    with pytest.raises(LookupError) as error:
        resolve_probes(cls(small_config()))
    assert "\n" not in str(error.value)
    assert all(message in str(error.value) for message in messages), str(error.value)


def test_without_final_norms_there_are_no_final_norm_points():
    config = small_config(n_layers=1, final_norm=False)
    full = probe_points(config.replace(final_norm=True))
    assert probe_points(config) == [point for point in full if point not in ("encoder.norm", "decoder.norm")]


def test_a_map_entry_for_an_absent_point_is_passed_over_but_a_misspelt_one_is_not():
    """One map serves every config: its "{stack}.norm" entry is no error where the config has no
    final norms, and a typo is still named there."""
    config = small_config(final_norm=False)
    assert "encoder.norm" not in resolve_probes(Explicit(config))
    with pytest.raises(LookupError, match=r"entry '\{stack\}.layers.\{i\}.selfattn' matches no probe point"):
        resolve_probes(Misspelt(config))

    class NormTypo(Explicit):
        probe_map: ClassVar[dict] = {**Explicit.probe_map, "{stack}.nrom": "x"}

    with pytest.raises(LookupError, match=r"entry '\{stack\}.nrom' matches no probe point"):
        resolve_probes(NormTypo(config))
