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
sites (``variants.check.sites``). An error raised inside the model is reported
with the file and line it came from and, where its text suggests one, a likely cause (for masks
a decoder reads swapped, found by trying the swap). Nothing here prints.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from common.cli import error_line
from common.config import TransformerConfig
from common.masks import padding_mask
from common.probes import Probe, resolve_probes
from common.random_batch import Batch, random_batch
from common.weights import canonical_shapes, export_gradients, export_weights, import_weights, init_canonical
from variants import REFERENCE, SpecError, build
from variants.check import sites
from variants.check.divergence import (
    ROUNDING_FACTOR,
    Float32Watch,
    PointDifference,
    compare_points,
    model_frame,
    number,
    precision_notes,
)
from variants.check.explain import Explanation, explain
from variants.check.outside import NORM_MODES, SIGNATURES, absent_weights, own_stage
from variants.check.tolerances import FLOAT32, FLOAT64, LOSSES, Tolerance

# whose output is a fully masked row's expected value (the reference's is NaN there, by design):
# the first, or the second when the first is the one under check
MASKED_ROW_EXPECTED = ("explicit", "mathfirst")
# d_ff an integer multiple of d_model (a model may build its FFN as expansion * d_model), and
# two vocabularies of different sizes, so a swapped one cannot pass
CONFIG = TransformerConfig(d_model=32, n_heads=4, n_layers=2, d_ff=128, dropout=0.0, src_vocab_size=23,
                           tgt_vocab_size=19, max_seq_len=40)
SHAPES = ((3, 7, 5), (2, 4, 9))  # (B, S, T): S > T and S < T; row r of a batch ends in r pads
MIN_VOCAB = 2  # the batches hold padding and real tokens: at least one id beside pad_id
STEPS = 3  # lockstep Adam steps (adam_step)
MASKED_ROW = 1  # the batch row whose source is padding only
MODES = tuple(NORM_MODES)  # ("post", "pre"): the order the modes run in


# the forward checks of each mode: (dtype, batch shapes, tolerance)
FORWARD_RUNS = ((torch.float64, SHAPES, FLOAT64), (torch.float32, SHAPES[:1], FLOAT32))


@dataclass(frozen=True)
class Case:
    """One forward comparison, as the finder reruns it."""

    against: str
    config: TransformerConfig
    dtype: torch.dtype
    inputs: tuple[Tensor, Tensor, Tensor, Tensor]  # src, tgt, src_mask, tgt_mask
    tolerance: Tolerance


@dataclass(frozen=True)
class Result:
    check: str
    passed: bool | None  # None: skipped, or a mode the class does not support
    max_abs: float | None = None
    tolerance: str = ""  # as printed
    detail: str = ""  # why it failed or was skipped
    case: Case | None = None  # a forward check's, for the finder
    bound: Tolerance | None = None  # the tolerance itself, as data
    config: TransformerConfig | None = None  # the config it ran under
    precision: bool = False  # passed as float32 rounding only: past tolerance, within the rounding


def mode_name(mode: str) -> str:
    return f"{mode}-norm"


def mode_of(config: TransformerConfig) -> str:
    return mode_name("pre" if config.norm_first else "post")


def short(name: str) -> str:
    """A spec's class name (a registered name as it is)."""
    return name.rpartition(":")[2]


def battery_weights(config: TransformerConfig, seed: int) -> dict[str, Tensor]:
    """``init_canonical``'s weights with every bias and LayerNorm gain and shift drawn at random
    too, so a model that drops, swaps or misplaces any tensor computes something else."""
    state = init_canonical(config, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    for name, tensor in state.items():
        if tensor.ndim == 1:
            state[name] = tensor + 0.2 * torch.randn(tensor.shape, generator=generator)
    return state


def held_at_zero(model: nn.Module) -> tuple[str, ...]:
    """The canonical biases ``model`` declares absent: both models hold them at zero, and the
    gradient checks leave them out. An absent weight that is not a bias (a norm's gain, a
    matrix) is not zero in a model that lacks it, so it stays a real difference."""
    return tuple(name for name in absent_weights(model) if name.endswith(".bias"))


def absent_line(spec: str, config: TransformerConfig) -> str:
    """One line on the weights ``spec``'s map declares absent (None), and how each is checked;
    "" if none."""
    model = build(spec, config)
    zeroed = held_at_zero(model)
    kept = [name for name in absent_weights(model) if name not in zeroed]
    parts = []
    if zeroed:
        parts.append(f"{len(zeroed)} biases, held at zero in both models and left out of the gradient checks "
                     f"({', '.join(zeroed[:2])}{', ...' if len(zeroed) > 2 else ''})")
    if kept:
        parts.append(f"{len(kept)} weights, compared as they are (a model without them computes something "
                     f"else): {', '.join(kept)}")
    return f"declared absent (None in the weight map): {'; '.join(parts)}" if parts else ""


def pair(spec: str, against: str, config: TransformerConfig, seed: int) -> tuple[nn.Module, nn.Module]:
    """``spec`` and ``against`` built for ``config`` with the same weights, float32, eval mode.
    Parameters outside the canonical set (``extra_parameters``) get the same draw every run; the
    biases ``spec`` declares absent are zero in both."""
    state = battery_weights(config, seed)
    models = []
    for name in (spec, against):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build(name, config)
        for absent in held_at_zero(model):
            state[absent] = torch.zeros_like(state[absent])
        models.append(model)
    for model in models:
        import_weights(model, state)
        model.eval()
    return models[0], models[1]


def supported_configs(spec: str, config: TransformerConfig, modes: tuple[str, ...]
                      ) -> tuple[list[TransformerConfig], list[Result]]:
    """``config`` in each of ``modes`` that ``spec`` can be built in, and a "not supported" row for
    each other. SpecError if it supports none of them."""
    configs, unsupported = [], []
    for mode in modes:
        mode_config = config.replace(norm_first=NORM_MODES[mode])
        try:
            build(spec, mode_config)
        except NotImplementedError as error:
            why = str(error).strip() or "NotImplementedError"
            unsupported.append(Result(f"{mode_name(mode)}: every check", None, detail=f"not supported: {why}",
                                      config=mode_config))
            continue
        configs.append(mode_config)
    if not configs:
        reasons = "; ".join(f"{r.check.partition(':')[0]} {r.detail}" for r in unsupported)
        raise SpecError(f"{spec}: can be built in none of the norm modes asked for ({reasons})")
    return configs, unsupported


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


def locate(spec: str, case: Case, seed: int = 0) -> list[PointDifference]:
    """The failed forward ``case`` rerun point by point: where ``spec`` and ``case.against`` part.
    In float64, each point also carries the reference's own float32 rounding there."""
    subject, other = pair(spec, case.against, case.config, seed)
    other_float32 = copy.deepcopy(other) if case.dtype == torch.float64 else None
    subject, other = subject.to(case.dtype), other.to(case.dtype)
    return compare_points(subject, other, case.inputs, names=(short(spec), short(case.against)),
                          b_float32=other_float32, stand_ins=(stand_ins(subject), stand_ins(other)))


def explain_first(spec: str, case: Case, seed: int, differences: list[PointDifference]) -> str:
    """The explanation of the first divergence in ``differences`` (``variants.check.explain``),
    as one line; "" where there is none to try."""
    first = next((d for d in differences if d.diverges(case.tolerance.atol)), None)
    if first is None:
        return ""
    subject, other = (model.double() for model in pair(spec, case.against, case.config, seed))
    found = explain(subject, other, case.inputs, (stand_ins(subject), stand_ins(other)), first,
                    FLOAT64.atol if case.dtype == torch.float64 else case.tolerance.atol)
    return found.line() if isinstance(found, Explanation) else found


def stand_ins(model: nn.Module) -> dict[str, Probe]:
    """Where to probe the final norms a model's maps declare absent (its probe map None, its
    weight map None for the norm's weights): the last layer's output, read as its own probe reads
    it (its call, its item of a tuple), never a later module's (a decoder that goes on to project,
    or returns more than its hidden state)."""
    if not hasattr(type(model), "probe_map"):
        return {}
    probes, absent = resolve_probes(model), set(absent_weights(model))
    found = {}
    for stack in ("encoder", "decoder"):
        point, last = f"{stack}.norm", probes.get(f"{stack}.layers.{model.config.n_layers - 1}")
        if probes.get(point, last) is not None or f"{point}.weight" not in absent or last is None:
            continue
        found[point] = last
    return found


# --- errors raised inside the model ---------------------------------------------------------

EXPECTED_CALLS = ", ".join(f"{stage}({', '.join(names)})" for stage, names in SIGNATURES.items())
MASK_LAYOUT = ("src_mask (B, 1, 1, S) and tgt_mask (B, 1, T, T), bool, True = may attend; "
               "a model written for (B, 1, S) masks adds an axis of its own")
MASK_HINT = f"check the masks: the suite passes {MASK_LAYOUT}"
HINTS = (  # (what the error says, the likely cause)
    (re.compile(r"'indices'.*(Bool|Float|Double)|embedding.*(Bool|Float|Double)", re.S),
     f"an embedding got a mask or hidden states for ids: check the argument order; the suite calls "
     f"{EXPECTED_CALLS}"),
    (re.compile(r"must match the size of tensor|shape mismatch|not broadcastable|cannot broadcast"
                r"|invalid for input of size|doesn't match the broadcast shape", re.I),
     MASK_HINT),
)


def where_raised(error: BaseException) -> str:
    """``file:line in function`` of the innermost frame of the model's own code (not torch's, not
    the suite's) that ``error`` passed through; "" if none did."""
    return model_frame(traceback.extract_tb(error.__traceback__))


def hint_for(error: BaseException) -> str:
    """The likely cause of an error raised inside a model, where its text suggests one."""
    return next((hint for pattern, hint in HINTS if pattern.search(str(error))), "")


def explained(error: BaseException, hint: bool = True) -> str:
    """One line: the error, where in the model's code it was raised, and a hint."""
    place, hint = where_raised(error), hint_for(error) if hint else ""
    return error_line(error) + (f" (at {place})" if place else "") + (f"; hint: {hint}" if hint else "")


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
    return result


def rounding_only(spec: str, case: Case, seed: int) -> str:
    """Why the failed float64 ``case`` is float32 rounding and nothing else, "" if it is not: rerun
    point by point, every point that departs from the reference does so within the reference's
    own float32 rounding there, with float32 on the model's path (``Float32Watch``), the output
    included."""
    try:
        differences = locate(spec, case, seed)
    except Exception:  # no probe map, or a model the finder cannot rerun: not judged, it stays failed
        return ""
    tolerance = case.tolerance.atol
    output = next((d for d in differences if d.point == "generator"), None)
    if (output is None or not output.departs(tolerance) or not output.within_rounding()
            or any(d.diverges(tolerance) for d in differences)):
        return ""
    (note,) = precision_notes(differences, tolerance) or (
        f"{output.point} differs by {number(output.max_abs)}",)
    return (f"float32 rounding only: {note}; every point within {ROUNDING_FACTOR:g}x the reference's own "
            f"float32 rounding there")


def output_hint(model: nn.Module, case: Case, actual: Tensor, expected: Tensor) -> str:
    """The likely cause of a failed forward, read from the output: a flat (B·T, V) tensor, an extra
    axis a mask broadcast into it, logits where log-probabilities belong, NaN behind a -inf fill."""
    batch, length = case.inputs[1].shape
    vocab = case.config.tgt_vocab_size
    if actual.shape == (batch * length, vocab):
        return (f"a flat (B·T, V) output: return (B, T, V) log-probabilities, e.g. log_probs.view({batch}, "
                f"{length}, -1) for this batch (the gradient and training checks reshape it to go on)")
    if actual.ndim > expected.ndim:
        return broadcast_hint(model, case, tuple(actual.shape), tuple(expected.shape))
    if actual.shape != expected.shape or not actual.is_floating_point():
        return ""
    nan = torch.isnan(actual) & ~torch.isnan(expected)
    if nan.any():
        with FillWatch() as fills, torch.no_grad():
            model(*case.inputs)
        positions = int(nan.any(-1).sum())
        if any(value == -math.inf for value in fills.values):
            return (f"NaN at {positions} positions: masked scores are filled with -inf, so a row with no "
                    f"key to attend to (a source of padding only) is softmax of -inf everywhere; fill with "
                    f"torch.finfo(scores.dtype).min")
        return (f"NaN at {positions} positions where the reference is finite "
                f"(a row with nothing to attend to?)")
    finite = actual[torch.isfinite(actual).all(-1)].double()
    if finite.numel():
        total = finite.logsumexp(-1).abs().max().item()
        if total > 1e-6 if case.dtype == torch.float64 else total > 1e-3:
            return (f"the rows' logsumexp is up to {total:.2g}, not 0: logits, not log-probabilities; "
                    f"end with log_softmax(dim=-1)")
    return ""


def broadcast_hint(model: nn.Module, case: Case, actual: tuple[int, ...], expected: tuple[int, ...]) -> str:
    """Where a mask grew the model's tensors by an axis (``BroadcastWatch``), for an output with
    more axes than the reference's; "" where no mask did."""
    with BroadcastWatch() as watch, torch.no_grad(), contextlib.suppress(Exception):
        model(*case.inputs)  # it ran in the forward check already: only what the watch sees matters
    if watch.found is None:
        return ""
    name, tensor, mask, out, place = watch.found
    fix = (": scores of one head, (B, T_query, T_key), take src_mask[:, 0] and tgt_mask[:, 0]"
           if len(tensor) == 3 else "")
    return (f"the output is {actual} where the reference's is {expected}: {name}"
            f"{f' at {place}' if place else ''} broadcast a {tensor} tensor against a {mask} mask to {out}, "
            f"and nothing raised; the model's masks have another layout: the suite passes src_mask "
            f"(B, 1, 1, S) and tgt_mask (B, 1, T, T){fix}")


class BroadcastWatch(TorchFunctionMode):
    """The first operation of a forward pass whose output has more axes than the tensor it works
    on because a boolean mask with more axes broadcast it: (operation, the tensor's shape, the
    mask's, the output's, where in the model's code)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: tuple[str, tuple, tuple, tuple, str] | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.found is None and isinstance(out, Tensor):
            tensors = [item for item in (*args, *(kwargs or {}).values()) if isinstance(item, Tensor)]
            masks = [t for t in tensors if t.dtype == torch.bool and t.ndim == out.ndim]
            if tensors and tensors[0].dtype != torch.bool and masks and out.ndim > tensors[0].ndim:
                name = getattr(func, "__name__", str(func))
                self.found = (name, tuple(tensors[0].shape), tuple(masks[0].shape), tuple(out.shape),
                              model_frame(traceback.extract_stack()[:-1]))
        return out


class FillWatch(TorchFunctionMode):
    """The values a forward pass fills masked scores with (``masked_fill``)."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[float] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.masked_fill, torch.Tensor.masked_fill_, torch.masked_fill):
            value = args[2] if len(args) > 2 else kwargs.get("value")
            if isinstance(value, (int, float)):
                self.values.append(float(value))
        return func(*args, **kwargs)


def swap_masks(model: nn.Module, inputs: tuple[Tensor, ...], expected: Tensor) -> str:
    """Whether the model runs once src_mask and tgt_mask trade places in its own decode: a
    decoder that reads them the other way round. "" if it has no own decode or still fails."""
    decode, encode, project = (own_stage(model, stage) for stage in ("decode", "encode", "project"))
    if decode is None or encode is None or project is None:
        return ""
    src, tgt, src_mask, tgt_mask = inputs
    try:
        log_probs = project(decode(tgt, encode(src, src_mask), tgt_mask, src_mask))
    except Exception:
        return ""
    agrees = ""
    if log_probs.shape == expected.shape:
        agrees = (f", and then agrees with the reference to "
                  f"{number((log_probs - expected).abs().max().item())}")
    return (f"with src_mask and tgt_mask exchanged in decode the model runs{agrees}: its decoder reads the "
            f"masks the other way round; the self-attention takes tgt_mask, the cross-attention src_mask")


def compared(check: str, actual: Tensor, expected: Tensor, tolerance: Tolerance, case: Case | None = None,
             ) -> Result:
    """``actual`` against ``expected`` within ``tolerance``, everywhere."""
    config = case.config if case is not None else None
    if actual.shape != expected.shape:
        shapes = f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
        return Result(check, False, None, str(tolerance), shapes, case, tolerance, config)
    delta = (actual.double() - expected.double()).abs()
    within = delta <= tolerance.atol + tolerance.rtol * expected.double().abs()
    return Result(check, bool(within.all()), delta.max().item(), str(tolerance), case=case, bound=tolerance,
                  config=config)


def loss_of(model: nn.Module, batch: Batch, pad_id: int) -> Tensor:
    """Mean NLL of the batch's labels over real target positions. A flat (B·T, V) output is
    taken as it is (the forward checks fail it and say so)."""
    log_probs = model(*batch.inputs())
    if log_probs.ndim == 2 and log_probs.shape[0] == batch.labels.numel():
        log_probs = log_probs.view(*batch.labels.shape, -1)
    return F.nll_loss(log_probs.flatten(0, 1), batch.labels.flatten(), ignore_index=pad_id)


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
    biases ``spec`` declares absent stay zero in both."""
    losses = []
    models = pair(spec, against, config, seed)
    zeroed = held_at_zero(models[0])
    for model in models:
        model.double().train()
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
        losses.append(torch.tensor(steps, dtype=torch.float64))
    result = compared(f"{STEPS} Adam steps float64 {mode_of(config)} (losses)", losses[0], losses[1], LOSSES)
    return Result(result.check, result.passed, result.max_abs, result.tolerance, bound=LOSSES, config=config)


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


def still_drops(spec: str, config: TransformerConfig, seed: int = 0) -> str | None:
    """The determinism probe: ``spec`` built with ``config`` (dropout 0), in train mode, run on
    one batch under two random seeds. The module whose output first differs between the two runs
    (in the order modules finish) is one that still drops; None if the two runs agree."""
    model = build(spec, config.replace(dropout=0.0), seed=seed).double().train()
    inputs = random_batch(config, seed=seed).inputs()
    runs = []
    for draw in (1, 2):
        outputs: list[tuple[str, Tensor]] = []
        handles = [module.register_forward_hook(partial(_record, name, outputs))
                   for name, module in model.named_modules() if name]
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                torch.manual_seed(draw)
                outputs.append(("", model(*inputs)))
        finally:
            for handle in handles:
                handle.remove()
        runs.append(outputs)
    for (name, first), (_, second) in zip(*runs, strict=False):
        if first.shape != second.shape or not torch.equal(first, second):
            module = model.get_submodule(name)
            return name + (f" ({module!r})" if not list(module.children()) else "") if name else "the model"
    return None


def _record(name: str, outputs: list[tuple[str, Tensor]], _module: nn.Module, _inputs, output) -> None:
    """A forward hook: the module's output (a tuple's first tensor) under its name."""
    if isinstance(output, tuple):
        output = next((item for item in output if isinstance(item, Tensor)), None)
    if isinstance(output, Tensor):
        outputs.append((name, output.detach().clone()))


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
