"""What went wrong, and why: the diagnosis the battery's failed checks get (the checks themselves
are ``variants.check.battery``).

``locate`` reruns a failed forward point by point (``variants.check.divergence``) and
``explain_first`` tries the classic departures at the first divergence (``variants.check.explain``);
``rounding_only`` tells a float64 check failed by float32 rounding alone; ``output_hint`` reads a
failed output (logits, NaN behind a -inf fill, a flat output, an extra axis from a mask broadcast in
the model's forward); an error raised inside the model is reported with the file and line it came
from and, where its text suggests one, a likely cause (``explained``; for masks a decoder reads
swapped, found by trying the swap); ``still_drops`` names a module that drops at dropout 0. Nothing
here prints.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
import traceback
from functools import partial

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from common.cli import error_line
from common.config import TransformerConfig
from common.probes import Probe, capture, resolve_probes
from common.random_batch import random_batch
from common.weights import import_weights
from variants import build
from variants.check.adapter import absent_weights, own_stage
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
from variants.check.harness import Case, battery_weights, held_at_zero, loss_of, pair, short
from variants.check.outside import SIGNATURES
from variants.check.tolerances import FLOAT64


def locate(spec: str, case: Case, seed: int = 0) -> list[PointDifference]:
    """The failed forward ``case`` rerun point by point: where ``spec`` and ``case.against`` part.
    In float64, each point also carries the reference's own float32 rounding there."""
    subject, other = pair(spec, case.against, case.config, seed)
    other_float32 = copy.deepcopy(other) if case.dtype == torch.float64 else None
    subject, other = subject.to(case.dtype), other.to(case.dtype)
    return compare_points(subject, other, case.inputs, names=(short(spec), short(case.against)),
                          b_float32=other_float32, stand_ins=(stand_ins(subject), stand_ins(other)))


def explanation(spec: str, case: Case, seed: int, differences: list[PointDifference]) -> Explanation | str:
    """The explanation of the first divergence in ``differences`` (``variants.check.explain``):
    the departure that fits, or a line saying none does; "" where there is none to try."""
    first = next((d for d in differences if d.diverges(case.tolerance.atol)), None)
    if first is None:
        return ""
    subject, other = (model.double() for model in pair(spec, case.against, case.config, seed))
    return explain(subject, other, case.inputs, (stand_ins(subject), stand_ins(other)), first,
                   FLOAT64.atol if case.dtype == torch.float64 else case.tolerance.atol)


def explain_first(spec: str, case: Case, seed: int, differences: list[PointDifference]) -> str:
    """``explanation`` as one line."""
    found = explanation(spec, case, seed, differences)
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


def padding_hint(case: Case, actual: Tensor, expected: Tensor) -> str:
    """Where ``actual`` departs from ``expected`` only at padded target positions, or only in a
    batch row whose source is padding only (every attention over it fully masked): that, and
    how closely every other position agrees; "" otherwise."""
    if actual.shape != expected.shape or actual.ndim != 3 or actual.shape[:2] != case.inputs[1].shape:
        return ""
    src, tgt = case.inputs[:2]
    pad = case.config.pad_id
    delta = (actual.double() - expected.double()).abs()
    positions = apart(delta, case.tolerance.atol + case.tolerance.rtol * expected.double().abs())  # (B, T)
    if not positions.any():
        return ""
    padded, empty = tgt == pad, (src == pad).all(-1)  # (B, T), (B,)
    elsewhere = ~padded & ~empty[:, None]
    agree = delta[elsewhere].max().item() if elsewhere.any() else 0.0
    if not (positions & ~padded).any():
        return (f"only the {int(positions.sum())} padded target positions (tgt == pad_id {pad}) differ; "
                f"at every real position the output agrees to {number(agree)}: the model computes "
                f"something else where the targets are padding, which no loss over real targets sees (the "
                f"loss ignores pad_id)")
    if empty.any() and not (positions & ~empty[:, None]).any():
        rows = ", ".join(str(row) for row in torch.nonzero(empty).flatten().tolist())
        return (f"only batch row {rows}, whose source is padding only, differs (every attention over "
                f"that source is fully masked); every other row agrees to {number(agree)}: the model gives "
                f"a fully masked attention row another output than the reference, which attends uniformly "
                f"to every key there")
    return ""


# a position differs where it is past the tolerance and past this fraction of the largest difference:
# rounding (float32 on the model's path) at every position is not what sets one position apart
APART = 1e-4


def apart(delta: Tensor, bound: Tensor | float) -> Tensor:
    """The positions (all axes but the last) where ``delta`` (NaN too) is past ``bound`` and past
    ``APART`` times its largest finite value."""
    finite = delta[torch.isfinite(delta)]
    floor = APART * finite.max().item() if finite.numel() else 0.0
    return (~((delta <= bound) | (delta <= floor))).any(-1)


def other_mode(spec: str, case: Case, seed: int) -> str:
    """Whether ``spec`` built for ``case``'s norm mode agrees with the reference in the other
    mode: a model that computes one mode whatever the config says. "" if it does not."""
    other = case.config.replace(norm_first=not case.config.norm_first)
    try:
        subject, reference = (model.to(case.dtype) for model in pair(spec, case.against, case.config, seed,
                                                                     against_config=other))
        with torch.no_grad():
            actual, expected = subject(*case.inputs), reference(*case.inputs)
    except Exception:  # the other mode cannot be built or run: nothing to say
        return ""
    if actual.shape != expected.shape:
        return ""
    delta = (actual.double() - expected.double()).abs()
    if not bool((delta <= case.tolerance.atol + case.tolerance.rtol * expected.double().abs()).all()):
        return ""
    mode, name = ("pre", "pre-norm") if other.norm_first else ("post", "post-norm")
    asked = "post-norm" if other.norm_first else "pre-norm"
    return (f"built for {asked}, the model agrees with the reference in {name} to "
            f"{number(delta.max().item())}: it passes as {name}; declare norm_modes = (\"{mode}\",) on the "
            f"class")


def padded_point(spec: str, case: Case, seed: int, point: str) -> str:
    """Where ``point``'s difference lies only at padded query positions (source padding for the
    encoder's points, target padding for the decoder's), that and what the model holds there;
    "" otherwise."""
    try:
        subject, reference = (model.double() for model in pair(spec, case.against, case.config, seed))
        got, want = capture(subject, case.inputs).get(point), capture(reference, case.inputs).get(point)
    except Exception:
        return ""
    if got is None or want is None or got.shape != want.shape or got.ndim != 3:
        return ""
    src, tgt = case.inputs[:2]
    ids = src if point.startswith(("src_embed", "encoder")) else tgt
    if got.shape[:2] != ids.shape:
        return ""
    padded = ids == case.config.pad_id
    positions = apart((got - want).abs(), FLOAT64.atol)
    if not positions.any() or (positions & ~padded).any():
        return ""
    held = got[positions]
    same = bool((held == held[0]).all())
    what = "zeros" if not held.any() else "one vector at every such position" if same else "other values"
    side = "source" if ids is src else "target"
    agree = (got - want).abs()[~padded].max().item() if (~padded).any() else 0.0
    empty = padded.all(-1)  # rows of padding only: every attention over them fully masked
    if empty.any() and not (positions & ~empty[:, None]).any():
        rows = ", ".join(str(row) for row in torch.nonzero(empty).flatten().tolist())
        return (f"{point} differs only in batch row {rows}, whose {side} is padding only (every attention "
                f"over it fully masked), where the model puts {what}; every other row agrees to "
                f"{number((got - want).abs()[~empty].max().item())}")
    return (f"{point} differs only at padded {side} positions ({int(positions.sum())} of them), where the "
            f"model puts {what}; every real position agrees to {number(agree)}")


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


def trained_extras(spec: str, config: TransformerConfig, seed: int = 0) -> tuple[list[str], list[str]]:
    """What a training check sees that the forward checks do not: the parameters ``spec``
    trains that the reference lacks (its ``extra_parameters`` a loss's gradient reaches, with that
    gradient's largest value), and each float32 source on its path (``Float32Watch``)."""
    model = build(spec, config)
    state = battery_weights(config, seed)
    for name in held_at_zero(model):
        state[name] = torch.zeros_like(state[name])
    import_weights(model, state)
    model.double().train()
    with Float32Watch(model) as watch:
        loss_of(model, random_batch(config, seed=seed), config.pad_id).backward()
    extras = set(getattr(type(model), "extra_parameters", ()))
    moved = [f"{name} (gradient up to {param.grad.abs().max().item():.2g})"
             for name, param in model.named_parameters()
             if name in extras and param.grad is not None and bool(param.grad.any())]
    return moved, watch.sources
