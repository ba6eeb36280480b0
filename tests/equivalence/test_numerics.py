"""Numerics: fully masked attention rows stay finite, low precision stays close to float32, and
a seed fixes every bit on CPU."""

from __future__ import annotations

import contextlib

import pytest
import torch

from benchmarks.studies import low_precision
from benchmarks.studies.low_precision import CONFIG as LOW_PRECISION_CONFIG
from benchmarks.studies.low_precision import MEASURED
from common.masks import padding_mask
from common.random_batch import random_batch
from common.weights import export_gradients, export_weights, import_weights, transfer
from tests.helpers import FLOAT64_TOL, small_config
from variants import FROM_SCRATCH, REFERENCE, VARIANTS, build

# The reference fills masked scores with -inf, so its fully masked rows are NaN by design
# (variants/reference.py); the promise of finite, equal rows is the from-scratch variants' own,
# and the tests of it are parametrised over ``FROM_SCRATCH`` instead of the ``variant`` fixture.

# Low-precision bounds: largest |log p(low precision) - log p(float32)| allowed, all positions,
# rtol 0, derived here from what benchmarks/studies/low_precision.py measured (MEASURED: the worst case of
# each variant and mode over 48 runs, post-/pre-norm, 2 and 6 layers, 12 seeds) times MARGIN.
# The runs below (seed 0, 2 layers, both norms) are among those 48 and measure about half
# their worst case, so on the measuring machine the bounds hold with room; MARGIN is for
# another CPU's kernels. A slow test re-measures MEASURED.
MARGIN = 1.25
# Per dtype, for comparisons that are not one variant against its own float32 (two from-scratch
# variants in one dtype, whose measured spread is below the worst case: bf16 0.0625, fp16
# 0.0078; CUDA, not measured yet): the worst case of any variant and mode, times MARGIN.
LOW_PRECISION_ATOL = {
    dtype: MARGIN * max(worst for (_, d), cells in MEASURED.items() if d == dtype for worst in cells.values())
    for dtype in (torch.bfloat16, torch.float16)
}
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
PAD_ROW = 1


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """How close two runs of one function must be in ``dtype``."""
    if dtype == torch.float64:
        return FLOAT64_TOL
    if dtype in LOW_PRECISION_ATOL:
        return dict(atol=LOW_PRECISION_ATOL[dtype], rtol=0.0)
    return {}  # float32: assert_close's defaults, the equivalence promise


@contextlib.contextmanager
def skip_if_unsupported(dtype: torch.dtype):
    """Skip (visibly) where this CPU build lacks a kernel for ``dtype``; any other error fails."""
    names = {torch.float16: ("'half'", "float16"), torch.bfloat16: ("'bfloat16'",)}.get(dtype, ())
    try:
        yield
    except (RuntimeError, NotImplementedError) as error:
        message = str(error).lower()  # e.g. "addmm_impl_cpu_" not implemented for 'Half'
        if "not implemented for" in message and any(name in message for name in names):
            pytest.skip(f"this build has no {dtype} kernel: {error}")
        raise


def batch_with_pad_row(config, seed: int = 0):
    """4 sequences; sequence PAD_ROW is padding only, so every attention row over its source
    (encoder self-attention and decoder cross-attention) is fully masked."""
    batch = random_batch(config, batch=4, src_len=7, tgt_len=5, seed=seed)
    src = batch.src.clone()
    src[PAD_ROW] = config.pad_id
    return src, batch.tgt, padding_mask(src, config.pad_id), batch.tgt_mask


def from_scratch_models(config, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.nn.Module]:
    """Every from-scratch variant, holding the first one's weights by ``transfer``."""
    first = build(FROM_SCRATCH[0], config, seed=seed)
    models = {FROM_SCRATCH[0]: first}
    for name in FROM_SCRATCH[1:]:
        models[name] = build(name, config)
        transfer(first, models[name])
    return {name: model.to(dtype) for name, model in models.items()}


# --- a fully masked attention row -------------------------------------------------------------


@pytest.mark.parametrize("variant", FROM_SCRATCH)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_padding_source_gives_finite_outputs_and_gradients(variant, dtype):
    config = small_config()  # dropout 0.1: train mode, the path gradients take
    model = build(variant, config, seed=0).to(dtype).train()
    src, tgt, src_mask, tgt_mask = batch_with_pad_row(config)
    with skip_if_unsupported(dtype):
        log_probs = model(src, tgt, src_mask, tgt_mask)
        assert torch.isfinite(log_probs).all()
        log_probs.float().sum().backward()
    grads = export_gradients(model)
    not_finite = [name for name, grad in grads.items() if not torch.isfinite(grad).all()]
    assert not not_finite, f"non-finite gradients in {dtype}: {not_finite}"
    # the padding-only sequence still reaches the loss: its (pad) embedding gets a gradient
    assert grads["src_embed.weight"][config.pad_id].abs().sum() > 0


@pytest.mark.parametrize("variant", FROM_SCRATCH)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_padding_source_leaves_the_other_sequences_unchanged(variant, dtype):
    config = small_config()
    model = build(variant, config, seed=0).to(dtype).eval()
    batch = batch_with_pad_row(config)
    others = [row for row in range(batch[0].shape[0]) if row != PAD_ROW]
    with torch.no_grad(), skip_if_unsupported(dtype):
        together = model(*batch)[others]
        alone = model(*(t[others] for t in batch))
    # measured: bit-identical in every dtype; assert_close's per-dtype defaults leave room for
    # a BLAS that blocks a batch of 3 differently from a batch of 4
    torch.testing.assert_close(together, alone, **({} if dtype != torch.float64 else FLOAT64_TOL))


@pytest.mark.parametrize("variant", FROM_SCRATCH[1:])  # each against FROM_SCRATCH[0]
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_padding_source_same_in_every_from_scratch_variant(variant, dtype):
    config = small_config()
    models = from_scratch_models(config, dtype)
    batch = batch_with_pad_row(config)
    with torch.no_grad(), skip_if_unsupported(dtype):
        expected = models[FROM_SCRATCH[0]].eval()(*batch)
        actual = models[variant].eval()(*batch)
    assert torch.isfinite(actual).all()
    torch.testing.assert_close(actual, expected, **tolerance(dtype))


def uniform_attention_state(state: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """The same weights with W_q and b_q zeroed in every attention whose rows the padding-only
    source masks fully: Q = 0 makes every score equal, so softmax is uniform over all keys."""
    zeroed = dict(state)
    prefixes = [f"encoder.layers.{i}.self_attn" for i in range(config.n_layers)]
    prefixes += [f"decoder.layers.{i}.cross_attn" for i in range(config.n_layers)]
    for prefix in prefixes:
        for kind in ("weight", "bias"):
            zeroed[f"{prefix}.wq.{kind}"] = torch.zeros_like(state[f"{prefix}.wq.{kind}"])
    return zeroed


@pytest.mark.parametrize("variant", FROM_SCRATCH)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_fully_masked_row_is_uniform_attention_over_all_keys(variant, norm_first):
    """What a fully masked row computes, checked against code that shares nothing with the
    variant's masking: filling every score with finfo.min makes them equal, so the row attends
    uniformly to every key, padding included, which is what the reference computes unmasked
    when all scores are equal (W_q = 0)."""
    config = small_config(norm_first=norm_first)
    model = build(variant, config, seed=0).double().eval()
    reference = build(REFERENCE, config)
    import_weights(reference, uniform_attention_state(export_weights(model), config))
    reference.double().eval()
    src, tgt, src_mask, tgt_mask = batch_with_pad_row(config)
    row = slice(PAD_ROW, PAD_ROW + 1)
    with torch.no_grad():
        actual = model(src, tgt, src_mask, tgt_mask)[row]
        expected = reference(src[row], tgt[row], None, tgt_mask[row])
    torch.testing.assert_close(actual, expected, **FLOAT64_TOL)


# --- low precision against float32 ------------------------------------------------------------


def cast_model(dtype: torch.dtype):
    def run(model, batch):
        return model.to(dtype)(*batch)
    return run


def autocast(device_type: str, dtype: torch.dtype):
    def run(model, batch):
        with torch.autocast(device_type, dtype=dtype):
            return model(*batch)
    return run


CPU_MODES = {  # name -> (how to run, dtype, the script's mode)
    "to-bfloat16": (cast_model(torch.bfloat16), torch.bfloat16, "to"),
    "autocast-cpu-bfloat16": (autocast("cpu", torch.bfloat16), torch.bfloat16, "autocast"),
    "to-float16": (cast_model(torch.float16), torch.float16, "to"),
    "autocast-cpu-float16": (autocast("cpu", torch.float16), torch.float16, "autocast"),
}


def compare_with_float32(variant: str, run, dtype: torch.dtype, device: str, atol: float) -> None:
    for norm_first in (False, True):
        config = small_config(norm_first=norm_first)
        batch = random_batch(config, device=device).inputs()
        with torch.no_grad(), skip_if_unsupported(dtype):
            expected = build(variant, config, seed=0).to(device).eval()(*batch)
            actual = run(build(variant, config, seed=0).to(device).eval(), batch)
        assert torch.isfinite(actual).all()
        torch.testing.assert_close(actual.float(), expected, atol=atol, rtol=0.0,
                                   msg=lambda m, nf=norm_first: f"norm_first={nf}: {m}")


def test_the_bounds_hold_the_model_the_script_measured():
    """The bounds come from benchmarks/studies/low_precision.py's measurement, made on its CONFIG, of
    every variant and mode that the tests bound."""
    assert small_config() == LOW_PRECISION_CONFIG
    assert {(mode, dtype) for _, dtype, mode in CPU_MODES.values()} == set(MEASURED)
    assert all(set(cells) == set(VARIANTS) for cells in MEASURED.values())


@pytest.mark.parametrize("mode", list(CPU_MODES))
def test_low_precision_agrees_with_float32(variant, mode):
    """Within MARGIN times what the script measured for this variant and mode."""
    run, dtype, measured_mode = CPU_MODES[mode]
    compare_with_float32(variant, run, dtype, "cpu", MARGIN * MEASURED[measured_mode, dtype][variant])


# How far another CPU's kernels move a recorded worst case: an Intel Xeon measured explicit's
# ``to(float16)`` at 0.0135 (recorded on an AMD EPYC: 0.0101) and its float16 autocast at
# 0.00745 (0.006), factors of 1.34 and 1.24. Pinning the digits failed there; a factor of 2
# either way still fails a record gone stale (a change that halves or doubles an error).
RECORD_FACTOR = 2.0


@pytest.mark.slow
def test_the_recorded_measurement_is_what_the_script_measures():
    """MEASURED, from which the bounds are derived, is a measurement: the script finds every
    cell again within RECORD_FACTOR, on whichever CPU runs it."""
    measured = low_precision.measure()
    assert measured.keys() == MEASURED.keys()
    for key, recorded in MEASURED.items():
        for name, worst in recorded.items():
            found = measured[key][name]
            assert worst / RECORD_FACTOR <= found <= worst * RECORD_FACTOR, (key, name, measured[key])


# --- determinism ------------------------------------------------------------------------------


def test_same_seed_gives_bit_identical_outputs_and_gradients(variant):
    """Two separately built models, one seed, one input: every bit equal on CPU, in eval and in
    train mode (dropout masks drawn after torch.manual_seed)."""
    config = small_config()
    batch = random_batch(config).inputs()
    runs = []
    for _ in range(2):
        model = build(variant, config, seed=0)
        with torch.no_grad():
            eval_out = model.eval()(*batch)
        torch.manual_seed(1234)
        train_out = model.train()(*batch)
        train_out.sum().backward()
        runs.append((eval_out, train_out.detach(), [p.grad for p in model.parameters()]))
    (eval_a, train_a, grads_a), (eval_b, train_b, grads_b) = runs
    assert torch.equal(eval_a, eval_b)
    assert torch.equal(train_a, train_b)
    assert not torch.equal(eval_a, train_a), "dropout should have changed the train-mode output"
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))


# --- CUDA -------------------------------------------------------------------------------------

CUDA_MODES = {
    "to-bfloat16": (cast_model(torch.bfloat16), torch.bfloat16),
    "to-float16": (cast_model(torch.float16), torch.float16),
    "autocast-cuda-bfloat16": (autocast("cuda", torch.bfloat16), torch.bfloat16),
    "autocast-cuda-float16": (autocast("cuda", torch.float16), torch.float16),
}


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(CUDA_MODES))
def test_low_precision_agrees_with_float32_on_cuda(variant, mode):
    run, dtype = CUDA_MODES[mode]
    compare_with_float32(variant, run, dtype, "cuda", LOW_PRECISION_ATOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("variant", FROM_SCRATCH)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_all_padding_source_finite_on_cuda(variant, dtype):
    config = small_config()
    model = build(variant, config, seed=0).cuda().to(dtype).train()
    batch = tuple(t.cuda() for t in batch_with_pad_row(config))
    log_probs = model(*batch)
    assert torch.isfinite(log_probs).all()
    log_probs.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    with torch.no_grad():
        cpu = build(variant, config, seed=0).to(dtype).eval()(*batch_with_pad_row(config))
        torch.testing.assert_close(model.eval()(*batch).cpu(), cpu, **tolerance(dtype))
