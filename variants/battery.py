"""The equivalence battery of ``python -m variants.check``: one implementation against another (the
reference by default), both holding the same seeded canonical weights, on a small model.

Each check gives a ``Result`` (check, passed, largest difference, tolerance); a failed forward
check carries its ``Case``, which ``locate`` reruns point by point (``common.probes``) to name
where the two first part. Every check runs in each norm mode the class supports (``norm_modes``);
a mode it does not support is one "not supported" row, not a failure. A failed gradient check
names the first weight, in order of computation, whose gradient differs, and ``still_drops``
names a module that drops at dropout 0. An error raised inside the model is reported with the
file and line it came from and, where its text suggests one, a likely cause. Nothing here prints.
"""

from __future__ import annotations

import copy
import os
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.batches import Batch, random_batch
from common.cli import error_line
from common.config import TransformerConfig
from common.masks import padding_mask
from common.probes import PointDifference, Probe, compare_points, resolve_probes
from common.weights import canonical_shapes, export_gradients, export_weights, import_weights, init_canonical
from variants import REFERENCE, SpecError, build
from variants.outside import ABSENT, NORM_MODES, SIGNATURES, absent_weights

# whose output is a fully masked row's expected value (the reference's is NaN there, by design):
# the first, or the second when the first is the one under check
MASKED_ROW_EXPECTED = ("explicit", "mathfirst")
# d_ff an integer multiple of d_model (a model may build its FFN as expansion * d_model), and
# two vocabularies of different sizes, so a swapped one cannot pass
CONFIG = TransformerConfig(d_model=32, n_heads=4, n_layers=2, d_ff=128, dropout=0.0, src_vocab_size=23,
                           tgt_vocab_size=19, max_seq_len=40)
SHAPES = ((3, 7, 5), (2, 4, 9))  # (B, S, T): S > T and S < T; row r of a batch ends in r pads
STEPS = 3  # lockstep Adam steps (adam_step)
MASKED_ROW = 1  # the batch row whose source is padding only
MODES = tuple(NORM_MODES)  # ("post", "pre"): the order the modes run in


@dataclass(frozen=True)
class Tolerance:
    """|actual - expected| <= atol + rtol * |expected| at every element."""

    atol: float
    rtol: float = 0.0

    def __str__(self) -> str:
        return f"{self.atol:g}" + (f" + {self.rtol:g}·|expected|" if self.rtol else "")


FLOAT64 = Tolerance(1e-10)  # DESIGN.md: log-probs and gradients in float64
FLOAT32 = Tolerance(1e-5, 1.3e-6)  # torch.testing.assert_close's float32 defaults
LOSSES = Tolerance(1e-8)  # DESIGN.md: optimiser steps in float64
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
                modes: tuple[str, ...] = MODES) -> list[Result]:
    """Every check of ``spec`` against ``against`` in each of ``modes`` it supports; SpecError if
    ``spec`` cannot be built at all. ``config``'s norm_first is set per mode."""
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


def stand_ins(model: nn.Module) -> dict[str, Probe]:
    """Where to probe the final norms a model's maps declare absent (its probe map None, its
    weight map None for the norm's weights): the output of the stack module that holds the
    layers, or, if the layers hang from the model itself, the last layer's output."""
    if not hasattr(type(model), "probe_map"):
        return {}
    probes, absent = resolve_probes(model), set(absent_weights(model))
    modules = dict(model.named_modules())
    found = {}
    for stack in ("encoder", "decoder"):
        point, last = f"{stack}.norm", probes.get(f"{stack}.layers.{model.config.n_layers - 1}")
        if probes[point] is not None or f"{point}.weight" not in absent or last is None:
            continue
        holder = last.module.rpartition(".")[0].rpartition(".")[0]  # X.layers.1 -> X
        found[point] = Probe(holder) if holder and holder in modules and last.call == 0 else last
    return found


# --- errors raised inside the model ---------------------------------------------------------

_ROOT = Path(__file__).resolve().parents[1]
_SUITE = tuple(str(_ROOT / package) + os.sep for package in ("common", "variants"))  # not the model's code
_TORCH = str(Path(torch.__file__).resolve().parent) + os.sep
EXPECTED_CALLS = ", ".join(f"{stage}({', '.join(names)})" for stage, names in SIGNATURES.items())
MASK_LAYOUT = ("src_mask (B, 1, 1, S) and tgt_mask (B, 1, T, T), bool, True = may attend; "
               "a model written for (B, 1, S) masks adds an axis of its own")
HINTS = (  # (what the error says, the likely cause)
    (re.compile(r"'indices'.*(Bool|Float|Double)|embedding.*(Bool|Float|Double)", re.S),
     f"an embedding got a mask or hidden states for ids: check the argument order; the suite calls "
     f"{EXPECTED_CALLS}"),
    (re.compile(r"must match the size of tensor|shape mismatch|not broadcastable|cannot broadcast"
                r"|invalid for input of size|doesn't match the broadcast shape", re.I),
     f"check the masks: the suite passes {MASK_LAYOUT}"),
)


def where_raised(error: BaseException) -> str:
    """``file:line in function`` of the innermost frame of the model's own code (not torch's, not
    the suite's) that ``error`` passed through; "" if none did."""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if not frame.filename.startswith((_TORCH, *_SUITE)) and not frame.filename.startswith("<")]
    if not frames:
        return ""
    frame = frames[-1]
    path = os.path.relpath(frame.filename) if frame.filename.startswith(os.getcwd()) else frame.filename
    return f"{path}:{frame.lineno} in {frame.name}"


def hint_for(error: BaseException) -> str:
    """The likely cause of an error raised inside a model, where its text suggests one."""
    return next((hint for pattern, hint in HINTS if pattern.search(str(error))), "")


def explained(error: BaseException) -> str:
    """One line: the error, where in the model's code it was raised, and a hint."""
    place, hint = where_raised(error), hint_for(error)
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
        actual, expected = subject(*case.inputs), other(*case.inputs)
    return compared(check, actual, expected, case.tolerance, case)


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
    """Mean NLL of the batch's labels over real target positions."""
    log_probs = model(*batch.inputs())
    return F.nll_loss(log_probs.flatten(0, 1), batch.labels.flatten(), ignore_index=pad_id)


def computation_order(config: TransformerConfig) -> list[str]:
    """The canonical names in the order the forward pass first uses them."""
    names = list(canonical_shapes(config))
    names.remove("tgt_embed.weight")
    names.insert(names.index("encoder.norm.bias") + 1, "tgt_embed.weight")
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
    """The gradients of one loss under canonical names, float64; the first weight (in order of
    computation) whose gradient differs is named."""
    models = pair(spec, against, config, seed)
    grads, untouched = [], []
    for model in models:
        loss_of(model.double().train(), random_batch(config, seed=seed), config.pad_id).backward()
        got, missed = canonical_gradients(model)
        grads.append(got)
        untouched.append(missed)
    actual, expected = grads
    skipped = set(held_at_zero(models[0]))
    deltas = {name: (actual[name] - expected[name]).abs().max().item()
              for name in computation_order(config) if name not in skipped}
    worst = max(deltas.values())
    check = f"gradients float64 {mode_of(config)}"
    first = next((name for name, delta in deltas.items() if not delta <= FLOAT64.atol), None)
    detail = ""
    if first is not None:
        detail = f"first differs at {first} (max |Δ| {delta_text(deltas[first])})"
        never = [name for name in untouched[0] if not name.startswith(f"{ABSENT}.")]
        if never:
            detail += f"; no gradient reached {', '.join(never[:3])}" + (" ..." if len(never) > 3 else "")
    return Result(check, worst <= FLOAT64.atol, worst, str(FLOAT64), detail, bound=FLOAT64, config=config)


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
