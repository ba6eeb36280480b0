"""The equivalence battery of ``python -m variants.check``: one implementation against another (the
reference by default), both holding the same seeded canonical weights, on a small model.

Each check gives a ``Result`` (check, passed, largest difference, tolerance; the tolerances in
``variants.check.tolerances``); a failed forward check carries its ``Case``, which ``locate``
reruns point by point (``variants.check.divergence``) to name where the two first part. Every
check runs in each norm mode the class supports (``norm_modes``); a mode it does not support is
one "not supported" row, not a failure. A failed gradient check names the first weight, in order
of computation, whose gradient really differs (past float32 rounding where float32 is on the
path), zero embedding rows and weights no gradient reaches, and ``still_drops`` names a module
that drops at dropout 0. A float64 check whose every difference the finder attributes to float32
rounding (float32 on the model's path, within the reference's own float32 rounding at every
point) passes with that note (``Result.precision``): a correct model with a float32 table is not
failed. A failed forward carries a hint where the output suggests one (logits, NaN behind a -inf
fill, a flat output, an extra axis from a mask broadcast in the model's forward); the
dropout-sites check compares where dropout is applied in train mode with a named reference's
sites (``variants.check.sites``). The diagnosis of a failed check (where, why) is
``variants.check.diagnose``; the models and the ``Result`` rows, ``variants.check.harness``.
Nothing here prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor, nn

from common.config import TransformerConfig
from common.masks import padding_mask
from common.probes import resolve_probes
from common.random_batch import Batch, random_batch
from common.weights import canonical_shapes, export_gradients, export_weights, import_weights
from variants import REFERENCE, SpecError, build
from variants.check import sites
from variants.check.adapter import absent_weights
from variants.check.diagnose import (
    MASK_HINT,
    explained,
    hint_for,
    other_mode,
    output_hint,
    padding_hint,
    rounding_only,
    swap_masks,
)
from variants.check.divergence import ROUNDING_FACTOR, Float32Watch
from variants.check.harness import (
    CONFIG,
    FORWARD_RUNS,
    MASKED_ROW,
    MASKED_ROW_EXPECTED,
    MIN_VOCAB,
    MODES,
    STEPS,
    Case,
    Result,
    battery_weights,
    compared,
    held_at_zero,
    loss_of,
    mode_of,
    pair,
    supported_configs,
)
from variants.check.tolerances import FLOAT64, LOSSES, Tolerance


def run_battery(spec: str, against: str = REFERENCE, seed: int = 0, config: TransformerConfig = CONFIG,
                modes: tuple[str, ...] = MODES, dropout_reference: str = "torch") -> list[Result]:
    """Every check of ``spec`` against ``against`` in each of ``modes`` it supports, the dropout
    sites against ``dropout_reference``'s (``sites.REFERENCES``); SpecError if ``spec`` cannot be
    built at all; ValueError for vocabularies under MIN_VOCAB ids or an unknown reference.
    ``config``'s norm_first is set per mode."""
    if min(config.src_vocab_size, config.tgt_vocab_size) < MIN_VOCAB:
        raise ValueError(f"the battery needs vocabularies of at least {MIN_VOCAB} ids each (padding and "
                         f"a real token), got {config.src_vocab_size} and {config.tgt_vocab_size}")
    if dropout_reference not in sites.REFERENCES:
        raise ValueError(f"dropout_reference must be one of {', '.join(sites.REFERENCES)}, "
                         f"got {dropout_reference!r}")
    configs, unsupported = supported_configs(spec, config, modes)
    checks: list[tuple[str, Tolerance | None, TransformerConfig, Callable[[], Result]]] = []
    for mode_config in configs:
        mode = mode_of(mode_config)
        for dtype, shapes, tolerance in FORWARD_RUNS:
            for shape in shapes:
                inputs = random_batch(mode_config, *shape, seed=seed).inputs()
                case = Case(against, mode_config, dtype, inputs, tolerance)
                name = f"forward {str(dtype)[6:]} {mode} S={shape[1]} T={shape[2]}"
                checks.append((name, case.tolerance, mode_config, partial(forward, spec, case, seed, name)))
        checks.append((f"gradients float64 {mode}", FLOAT64, mode_config,
                       partial(gradients, spec, against, mode_config, seed)))
        checks.append((f"{STEPS} Adam steps float64 {mode} (losses)", LOSSES, mode_config,
                       partial(lockstep, spec, against, mode_config, seed)))
        checks.append((f"dropout sites {mode} (train mode, p={sites.P:g})", None, mode_config,
                       partial(dropout_sites, spec, mode_config, seed, dropout_reference)))
        if spec != REFERENCE:
            masked_against = (against if against != REFERENCE
                              else next(v for v in MASKED_ROW_EXPECTED if v != spec))
            case = Case(masked_against, mode_config, torch.float64, masked_batch(mode_config, seed), FLOAT64)
            name = f"fully masked source row {mode} vs {masked_against}"
            checks.append((name, FLOAT64, mode_config, partial(forward, spec, case, seed, name)))
    skipped = list(unsupported)
    if spec == REFERENCE:
        skipped.append(Result("fully masked source row", None, detail="NaN in the reference, by design"))
    checks.append(("bad inputs refused", None, configs[0], partial(bad_inputs, spec, seed, configs[0])))
    return [attempt(*check) for check in checks] + skipped



def attempt(check: str, tolerance: Tolerance | None, config: TransformerConfig | None,
            run: Callable[[], Result]) -> Result:
    """``run()``, or a failed result saying what the model raised, where, and its likely cause."""
    try:
        return run()
    except SpecError:
        raise
    except Exception as error:
        return Result(check, False, None, str(tolerance or ""), explained(error), bound=tolerance,
                      config=config)


# --- the checks -----------------------------------------------------------------------------


def forward(spec: str, case: Case, seed: int, check: str) -> Result:
    subject, other = (model.to(case.dtype) for model in pair(spec, case.against, case.config, seed))
    with torch.no_grad():
        expected = other(*case.inputs)
        try:
            actual = subject(*case.inputs)
        except Exception as error:
            swapped = swap_masks(subject, case.inputs, expected) if hint_for(error) == MASK_HINT else ""
            if not swapped:
                raise
            return Result(check, False, None, str(case.tolerance),
                          f"{explained(error, hint=False)}; hint: {swapped}",
                          bound=case.tolerance, config=case.config)
    result = compared(check, actual, expected, case.tolerance, case)
    hint = "" if result.passed else output_hint(subject, case, actual, expected)
    if hint:
        detail = "; ".join(filter(None, (result.detail, f"hint: {hint}")))
        result = dataclasses.replace(result, detail=detail)
    elif result.passed is False and case.dtype == torch.float64 and actual.shape == expected.shape:
        rounding = rounding_only(spec, case, seed)
        if rounding:
            result = dataclasses.replace(result, passed=True, precision=True, detail=rounding)
    if result.passed is False and not hint:
        clue = padding_hint(case, actual, expected) or other_mode(spec, case, seed)
        if clue:
            detail = "; ".join(filter(None, (result.detail, f"hint: {clue}")))
            result = dataclasses.replace(result, detail=detail)
    return result



def computation_order(config: TransformerConfig) -> list[str]:
    """The canonical names in the order the forward pass first uses them: the target embedding
    after the whole encoder (its final norm, where the config has one), before the decoder's
    first layer."""
    names = list(canonical_shapes(config))
    names.remove("tgt_embed.weight")
    names.insert(names.index("decoder.layers.0.self_attn.wq.weight"), "tgt_embed.weight")
    return names


def canonical_gradients(model: nn.Module) -> tuple[dict[str, Tensor], list[str]]:
    """The model's gradients under canonical names, and the parameters no gradient reached
    (counted as zero: a weight that takes no part in the loss, or an absent one's placeholder)."""
    untouched = [name for name, param in model.named_parameters() if param.grad is None]
    for param in model.parameters():
        if param.grad is None:
            param.grad = torch.zeros_like(param)
    return export_gradients(model), untouched


def gradients(spec: str, against: str, config: TransformerConfig, seed: int) -> Result:
    """The gradients of one loss under canonical names, float64. The detail names the first
    weight (in order of computation) whose gradient really differs: past tolerance and, where
    float32 is on the model's path, past the reference's own float32 rounding of that gradient;
    rows that get no gradient where the reference's do (an embedding's ``padding_idx``); and
    weights no gradient reaches at all."""
    models = pair(spec, against, config, seed)
    batch = random_batch(config, seed=seed)
    grads, untouched = [], []
    for model in models:
        model.double().train()  # before the watch: the conversion itself handles float32 tensors
        with Float32Watch(model) as watch:
            loss_of(model, batch, config.pad_id).backward()
        got, missed = canonical_gradients(model)
        grads.append(got)
        untouched.append(missed)
        if model is models[0]:
            float32_seen = watch.seen
    actual, expected = grads
    skipped = set(held_at_zero(models[0]))
    order = [name for name in computation_order(config) if name not in skipped]
    deltas = {name: (actual[name] - expected[name]).abs().max().item() for name in order}
    worst = max(deltas.values())
    check = f"gradients float64 {mode_of(config)}"
    if worst <= FLOAT64.atol:
        return Result(check, True, worst, str(FLOAT64), bound=FLOAT64, config=config)
    rounding = gradient_rounding(against, config, seed, batch) if float32_seen else {}
    rounded = [name for name in order if not deltas[name] <= FLOAT64.atol
               and deltas[name] <= ROUNDING_FACTOR * rounding.get(name, -1.0)]
    first = next((name for name in order if not deltas[name] <= FLOAT64.atol and name not in rounded), None)
    parts = []
    if first is not None:
        parts.append(f"first differs at {first} (max |Δ| {delta_text(deltas[first])})")
    if rounded:
        parts.append(f"{len(rounded)} {'differs' if len(rounded) == 1 else 'differ'} within float32 rounding "
                     f"({rounded[0]} {delta_text(deltas[rounded[0]])}{', ...' if len(rounded) > 1 else ''})")
    absent = set(absent_weights(models[0]))
    never = [name for name in order if not actual[name].any() and expected[name].any() and name not in absent]
    if never:
        parts.append(f"no gradient reaches {', '.join(never[:3])}{' ...' if len(never) > 3 else ''}")
    rows = {name: zero_rows(actual[name], expected[name]) for name in order
            if name.endswith("_embed.weight") and name not in never}
    rows = {name: found for name, found in rows.items() if found}
    if rows:
        name, found = next(iter(rows.items()))
        ids = ", ".join(map(str, found[:4])) + (" ..." if len(found) > 4 else "")
        parts.append(f"{'row' if len(found) == 1 else 'rows'} {ids} of {name}'s gradient "
                     f"{'is' if len(found) == 1 else 'are'} zero where the reference's "
                     f"{'is' if len(found) == 1 else 'are'} "
                     f"not: an embedding built with padding_idx? The suite's embeddings train every row "
                     f"(its pad id is {config.pad_id})")
    elif not never and first is None and not rounded:
        parts.append(f"max |Δ| {delta_text(worst)}")
    if first is None and rounded and not never and not rows:  # float32 rounding and nothing else
        return Result(check, True, worst, str(FLOAT64), f"float32 rounding only: {parts[0]}", bound=FLOAT64,
                      config=config, precision=True)
    return Result(check, False, worst, str(FLOAT64), "; ".join(parts), bound=FLOAT64, config=config)


def zero_rows(actual: Tensor, expected: Tensor) -> list[int]:
    """The rows of a 2-D gradient that are all zero in ``actual`` and not in ``expected``."""
    if actual.ndim != 2:
        return []
    zero, live = ~actual.bool().any(dim=1), expected.bool().any(dim=1)
    return torch.nonzero(zero & live).flatten().tolist()


def gradient_rounding(name: str, config: TransformerConfig, seed: int, batch: Batch) -> dict[str, float]:
    """How far ``name``'s own gradients computed in float32 lie from its float64 ones: what float32
    rounding alone does to each gradient."""
    runs = []
    for dtype in (torch.float32, torch.float64):
        model = build(name, config)
        import_weights(model, battery_weights(config, seed))
        loss_of(model.to(dtype).train(), batch, config.pad_id).backward()
        runs.append(canonical_gradients(model)[0])
    return {key: (runs[0][key].double() - runs[1][key]).abs().max().item() for key in runs[1]}


def delta_text(value: float) -> str:
    return "0" if value == 0 else f"{value:.2g}"


def lockstep(spec: str, against: str, config: TransformerConfig, seed: int) -> Result:
    """``STEPS`` Adam steps from the same weights on the same batches: the losses, float64. The
    biases ``spec`` declares absent stay zero in both. Where float32 is on the model's path
    (``Float32Watch``), losses that differ within ``ROUNDING_FACTOR`` times the reference's own
    float32 rounding of them (its steps in float32 against float64) pass as float32 rounding."""
    check = f"{STEPS} Adam steps float64 {mode_of(config)} (losses)"
    subject, other = pair(spec, against, config, seed)
    zeroed = held_at_zero(subject)
    subject.double()
    with Float32Watch(subject) as watch, torch.no_grad():  # one forward pass shows the float32 sources
        subject(*random_batch(config, 4, 7, 6, seed=seed + 1).inputs())
    actual = adam_losses(subject, config, seed, zeroed)
    expected = adam_losses(other.double(), config, seed, zeroed)
    result = compared(check, actual, expected, LOSSES)
    result = Result(result.check, result.passed, result.max_abs, result.tolerance, bound=LOSSES,
                    config=config)
    if result.passed or not watch.seen or actual.shape != expected.shape:
        return result
    low = adam_losses(pair(spec, against, config, seed)[1].float(), config, seed, zeroed)
    rounding = (low.double() - expected).abs().max().item()
    sources = "; the model's ".join(watch.sources) or "float32 on its path"
    if result.max_abs <= ROUNDING_FACTOR * rounding:
        return dataclasses.replace(result, passed=True, precision=True, detail=(
            f"float32 rounding only: the losses differ by {delta_text(result.max_abs)}, within "
            f"{ROUNDING_FACTOR:g}x the reference's own float32 rounding of them ({delta_text(rounding)}); "
            f"the model's {sources}"))
    return dataclasses.replace(result, detail=(
        f"past {ROUNDING_FACTOR:g}x the reference's own float32 rounding of the losses "
        f"({delta_text(rounding)}), though the model's {sources}"))


def adam_losses(model: nn.Module, config: TransformerConfig, seed: int, zeroed: tuple[str, ...]) -> Tensor:
    """The losses of ``STEPS`` Adam steps of ``model`` (in its dtype, train mode), float64."""
    model.train()
    params = list(model.parameters())
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    steps = []
    for step in range(1, STEPS + 1):
        model.zero_grad(set_to_none=True)
        loss = loss_of(model, random_batch(config, 4, 7, 6, seed=seed + step), config.pad_id)
        loss.backward()
        adam_step(params, moments, step)
        hold_at_zero(model, zeroed)
        steps.append(loss.item())
    return torch.tensor(steps, dtype=torch.float64)


def hold_at_zero(model: nn.Module, names: tuple[str, ...]) -> None:
    """Set the canonical weights ``names`` of ``model`` back to zero (after an optimiser step)."""
    if names:
        state = export_weights(model)
        for name in names:
            state[name].zero_()
        import_weights(model, state)


@torch.no_grad()
def adam_step(params: list[nn.Parameter], moments: list[tuple[Tensor, Tensor]], step: int,
              lr: float = 3e-3, betas: tuple[float, float] = (0.9, 0.98), eps: float = 1e-9) -> None:
    """One Adam step (Kingma and Ba; the paper's betas and eps), written out: torch.optim's first
    step imports torch.compile's machinery, seconds on a small machine."""
    for param, (m, v) in zip(params, moments, strict=True):
        if param.grad is None:
            continue
        m.mul_(betas[0]).add_(param.grad, alpha=1 - betas[0])
        v.mul_(betas[1]).addcmul_(param.grad, param.grad, value=1 - betas[1])
        m_hat, v_hat = m / (1 - betas[0] ** step), v / (1 - betas[1] ** step)
        param.sub_(lr * m_hat / (v_hat.sqrt() + eps))



def dropout_sites(spec: str, config: TransformerConfig, seed: int, reference: str = "torch") -> Result:
    """Where ``spec`` applies dropout in train mode against ``reference``'s sites
    (``variants.check.sites``): each missing, unexpected or at another probability named, and,
    where they are the other reference's sites exactly, the option that checks against those."""
    sites_config = config.replace(dropout=sites.P)
    model = build(spec, sites_config, seed=seed).double()
    check = f"dropout sites {mode_of(config)} (train mode, p={sites.P:g})"
    named = sites.REFERENCES[reference]
    try:
        resolve_probes(model)
    except LookupError:
        return Result(check, None, tolerance=named, detail="skipped: no probe map to place them by",
                      config=config)
    observed = sites.observed_sites(model, sites_config, seed)
    missing, extra, wrong_p = sites.compare_sites(observed, sites_config, reference)
    parts = [f"{label}: {', '.join(found[:3])}" + (f" (and {len(found) - 3} more)" if len(found) > 3 else "")
             for label, found in (("missing dropout", missing),
                                  (f"dropout where {named.partition(' (')[0]} have none", extra),
                                  (f"dropout not at the config's p={sites.P:g}", wrong_p)) if found]
    other = next(name for name in sites.REFERENCES if name != reference)
    if parts and not any(sites.compare_sites(observed, sites_config, other)):
        parts.append(f"hint: these are {sites.REFERENCES[other]} exactly: check against them with "
                     f"--dropout-sites {other}")
    return Result(check, not parts, None, named, "; ".join(parts), config=config)


def masked_batch(config: TransformerConfig, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A padded batch whose row ``MASKED_ROW`` has a source of padding only: every attention row
    over that source (encoder self-attention, cross-attention) is fully masked."""
    batch = random_batch(config, 4, 7, 5, seed=seed)
    src = batch.src.clone()
    src[MASKED_ROW] = config.pad_id
    return src, batch.tgt, padding_mask(src, config.pad_id), batch.tgt_mask


def bad_inputs(spec: str, seed: int, config: TransformerConfig = CONFIG) -> Result:
    """A handful of inputs the interface refuses with a TypeError or ValueError before computing."""
    model = build(spec, config)
    src, tgt, src_mask, tgt_mask = random_batch(config, seed=seed).inputs()
    too_big, too_long = tgt.clone(), tgt.new_ones(tgt.shape[0], config.max_seq_len + 1)
    too_big[0, 0] = config.tgt_vocab_size
    cases = {
        "a tgt id past tgt_vocab_size": (src, too_big, src_mask, tgt_mask),
        "float src": (src.double(), tgt, src_mask, tgt_mask),
        "a src_mask over S + 1 keys": (src, tgt, padding_mask(torch.cat([src, src[:, :1]], 1), 0), tgt_mask),
        "src and tgt of different batch sizes": (src, tgt[:-1], src_mask, tgt_mask[:-1]),
        "tgt past max_seq_len": (src, too_long, src_mask, None),
    }
    wrong = []
    for what, inputs in cases.items():
        try:
            with torch.no_grad():
                model.eval()(*inputs)
            wrong.append(f"{what}: accepted")
        except (TypeError, ValueError):
            pass
        except Exception as error:
            wrong.append(f"{what}: {type(error).__name__}")
    return Result(f"bad inputs refused ({len(cases) - len(wrong)} of {len(cases)})", not wrong, None,
                  "TypeError or ValueError", "; ".join(wrong), config=config)
