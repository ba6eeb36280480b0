"""benchmarks.studies.bandwidth: the weight bytes a cached step reads, counted from a model's own
parameters and by the architecture's formula; the bandwidth as bytes over the median sum time;
the last-level cache read from sysfs; settings refused by field."""

from __future__ import annotations

import math

import pytest
import torch

import benchmarks.studies.bandwidth as bandwidth
from benchmarks.compare.workload import TIMING_PRESETS
from benchmarks.studies.bandwidth import (
    BandwidthSettings,
    last_level_cache_bytes,
    read_bandwidth,
    step_weight_bytes,
)
from common.config import TransformerConfig
from tests.helpers import small_config
from variants import build


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_step_bytes_are_the_decoder_and_generator_parameters_but_the_cross_kv_projection(dtype):
    """Counted from fused's own modules: its cross-attention K/V projection is one Linear(D, 2D),
    which start_cache runs and a step does not."""
    config = small_config()
    model = build("fused", config).to(dtype)
    size = torch.empty((), dtype=dtype).element_size()
    kv = sum(p.numel() for layer in model.decoder.layers for p in layer.cross_attn.kv_proj.parameters())
    decoder = sum(p.numel() for p in model.decoder.parameters()) - kv
    generator = sum(p.numel() for p in model.generator.parameters())
    counted = step_weight_bytes(config, dtype, batch=3)
    assert (counted.decoder, counted.generator, counted.embedding_rows) == \
        (decoder * size, generator * size, 3 * config.d_model * size)
    assert counted.total == (decoder + generator + 3 * config.d_model) * size


def test_the_base_model_reads_164_mb_per_step_at_batch_8():
    """By the architecture: per decoder layer 4 self-attention and 2 cross-attention (D x D + D)
    projections, the feed-forward 2DF + F + D, three norms 2D each; a final norm; V(D + 1)."""
    config = TransformerConfig(**TIMING_PRESETS["base"].fields)
    d, f, v, n = config.d_model, config.d_ff, config.tgt_vocab_size, config.n_layers
    decoder = n * (6 * (d * d + d) + 2 * d * f + f + d + 3 * 2 * d) + 2 * d
    counted = step_weight_bytes(config, torch.float32, batch=8)
    assert counted.decoder == 4 * decoder
    assert counted.generator == 4 * v * (d + 1)
    assert counted.total == 4 * (decoder + v * (d + 1) + 8 * d) == 164_233_760


class FakeTimer:
    """A Timer whose every sum takes 0.25 s: the bandwidth must be bytes / 0.25."""

    def __init__(self, stmt, globals, **_):
        self.buffer = globals["buffer"]

    def timeit(self, number):
        return None

    def blocked_autorange(self, min_run_time):
        return type("M", (), {"median": 0.25, "mean": 1.0})()


def test_bandwidth_is_the_buffer_bytes_over_the_median_sum(monkeypatch):
    monkeypatch.setattr(bandwidth, "Timer", FakeTimer)
    measured = read_bandwidth(BandwidthSettings(buffer_bytes=4096 + 3))  # whole float32s only
    assert (measured.buffer_bytes, measured.bytes_per_second) == (4096, 4096 / 0.25)


def test_a_real_sum_gives_a_finite_positive_rate():
    measured = read_bandwidth(BandwidthSettings(buffer_bytes=2**20, min_run_time=0.01))
    assert measured.buffer_bytes == 2**20 and 0 < measured.bytes_per_second < math.inf


def test_the_last_level_cache_is_the_largest_size_in_sysfs(tmp_path):
    for index, size in enumerate(["32K", "512K", "32768K", "1M"]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 32 * 2**20
    assert last_level_cache_bytes(tmp_path / "missing") is None


@pytest.mark.parametrize(("field", "value"), [("threads", 0), ("buffer_bytes", 3), ("min_run_time", 0.0)])
def test_bad_settings_are_refused_by_field(field, value):
    with pytest.raises(ValueError, match=field):
        BandwidthSettings(**{field: value})
    with pytest.raises(ValueError, match="batch"):
        step_weight_bytes(small_config(), torch.float32, batch=0)
