"""The equivalence battery of ``python -m variants.check``: one implementation against another (the
reference by default), both holding the same seeded canonical weights, on a small model.

Each check gives a ``Result`` (check, passed, largest difference, tolerance); a failed forward
check carries its ``Case``, which ``locate`` reruns point by point (``common.probes``) to name
where the two first part. Nothing here prints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.batches import Batch, random_batch
from common.cli import error_line
from common.config import TransformerConfig
from common.masks import padding_mask
from common.probes import PointDifference, compare_points
from common.weights import export_gradients, import_weights, init_canonical
from variants import REFERENCE, SpecError, build

# whose output is a fully masked row's expected value (the reference's is NaN there, by design):
# the first, or the second when the first is the one under check
MASKED_ROW_EXPECTED = ("explicit", "mathfirst")
CONFIG = TransformerConfig(d_model=32, n_heads=4, n_layers=2, d_ff=48, dropout=0.0, src_vocab_size=23,
                           tgt_vocab_size=19, max_seq_len=40)
SHAPES = ((3, 7, 5), (2, 4, 9))  # (B, S, T): S > T and S < T; row r of a batch ends in r pads
STEPS = 3  # lockstep Adam steps (adam_step)
MASKED_ROW = 1  # the batch row whose source is padding only


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
    passed: bool | None  # None: skipped
    max_abs: float | None = None
    tolerance: str = ""
    detail: str = ""  # why it failed or was skipped
    case: Case | None = None  # a forward check's, for the finder


def battery_weights(config: TransformerConfig, seed: int) -> dict[str, Tensor]:
    """``init_canonical``'s weights with every bias and LayerNorm gain and shift drawn at random
    too, so a model that drops, swaps or misplaces any tensor computes something else."""
    state = init_canonical(config, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    for name, tensor in state.items():
        if tensor.ndim == 1:
            state[name] = tensor + 0.2 * torch.randn(tensor.shape, generator=generator)
    return state


def pair(spec: str, against: str, config: TransformerConfig, seed: int) -> tuple[nn.Module, nn.Module]:
    """``spec`` and ``against`` built for ``config`` with the same weights, float32, eval mode.
    Parameters outside the canonical set (``extra_parameters``) get the same draw every run."""
    state = battery_weights(config, seed)
    models = []
    for name in (spec, against):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build(name, config)
        import_weights(model, state)
        models.append(model.eval())
    return models[0], models[1]


def run_battery(spec: str, against: str = REFERENCE, seed: int = 0) -> list[Result]:
    """Every check of ``spec`` against ``against``; SpecError if ``spec`` cannot be built at all.

    A model that raises NotImplementedError when built pre-norm skips the pre-norm checks."""
    checks: list[tuple[str, Tolerance | None, Callable[[], Result]]] = []
    skipped = []
    for norm_first in (False, True):
        config = CONFIG.replace(norm_first=norm_first)
        mode = mode_of(config)
        try:
            build(spec, config)
        except NotImplementedError as error:
            if not norm_first:
                raise SpecError(f"{spec}: cannot be built post-norm ({error})") from error
            skipped.append(Result(f"{mode}: every check", None, detail=f"not supported: {error}"))
            continue
        for dtype, shapes in ((torch.float64, SHAPES), (torch.float32, SHAPES[:1])):
            for shape in shapes:
                case = Case(against, config, dtype, random_batch(config, *shape, seed=seed).inputs(),
                            FLOAT64 if dtype == torch.float64 else FLOAT32)
                name = f"forward {str(dtype)[6:]} {mode} S={shape[1]} T={shape[2]}"
                checks.append((name, case.tolerance, partial(forward, spec, case, seed, name)))
        checks.append((f"gradients float64 {mode}", FLOAT64, partial(gradients, spec, against, config, seed)))
        checks.append((f"{STEPS} Adam steps float64 {mode} (losses)", LOSSES,
                       partial(lockstep, spec, against, config, seed)))
    if spec == REFERENCE:
        skipped.append(Result("fully masked source row", None, detail="NaN in the reference, by design"))
    else:
        masked_against = (against if against != REFERENCE
                          else next(v for v in MASKED_ROW_EXPECTED if v != spec))
        case = Case(masked_against, CONFIG, torch.float64, masked_batch(CONFIG, seed), FLOAT64)
        name = f"fully masked source row vs {masked_against}"
        checks.append((name, FLOAT64, partial(forward, spec, case, seed, name)))
    checks.append(("bad inputs refused", None, partial(bad_inputs, spec, seed)))
    return [attempt(*check) for check in checks] + skipped


def locate(spec: str, case: Case, seed: int = 0) -> list[PointDifference]:
    """The failed forward ``case`` rerun point by point: where ``spec`` and ``case.against`` part."""
    subject, other = (model.to(case.dtype) for model in pair(spec, case.against, case.config, seed))
    return compare_points(subject, other, case.inputs, names=(short(spec), short(case.against)))


def mode_of(config: TransformerConfig) -> str:
    return "pre-norm" if config.norm_first else "post-norm"


def short(name: str) -> str:
    """A spec's class name (a registered name as it is)."""
    return name.rpartition(":")[2]


def attempt(check: str, tolerance: Tolerance | None, run: Callable[[], Result]) -> Result:
    """``run()``, or a failed result saying what the model raised."""
    try:
        return run()
    except SpecError:
        raise
    except Exception as error:
        detail = error_line(error)
        return Result(check, False, None, str(tolerance or ""), detail)


def forward(spec: str, case: Case, seed: int, check: str) -> Result:
    subject, other = (model.to(case.dtype) for model in pair(spec, case.against, case.config, seed))
    with torch.no_grad():
        actual, expected = subject(*case.inputs), other(*case.inputs)
    return compared(check, actual, expected, case.tolerance, case)


def compared(check: str, actual: Tensor, expected: Tensor, tolerance: Tolerance, case: Case | None = None,
             ) -> Result:
    """``actual`` against ``expected`` within ``tolerance``, everywhere."""
    if actual.shape != expected.shape:
        return Result(check, False, None, str(tolerance),
                      f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}", case)
    delta = (actual.double() - expected.double()).abs()
    within = delta <= tolerance.atol + tolerance.rtol * expected.double().abs()
    return Result(check, bool(within.all()), delta.max().item(), str(tolerance), case=case)


def loss_of(model: nn.Module, batch: Batch, pad_id: int) -> Tensor:
    """Mean NLL of the batch's labels over real target positions."""
    log_probs = model(*batch.inputs())
    return F.nll_loss(log_probs.flatten(0, 1), batch.labels.flatten(), ignore_index=pad_id)


def gradients(spec: str, against: str, config: TransformerConfig, seed: int) -> Result:
    """The gradients of one loss under canonical names, float64."""
    grads = []
    for model in pair(spec, against, config, seed):
        loss_of(model.double().train(), random_batch(config, seed=seed), config.pad_id).backward()
        grads.append(export_gradients(model))
    actual, expected = grads
    worst = max((actual[name] - expected[name]).abs().max().item() for name in expected)
    return Result(f"gradients float64 {mode_of(config)}", worst <= FLOAT64.atol, worst, str(FLOAT64))


def lockstep(spec: str, against: str, config: TransformerConfig, seed: int) -> Result:
    """``STEPS`` Adam steps from the same weights on the same batches: the losses, float64."""
    losses = []
    for model in pair(spec, against, config, seed):
        model.double().train()
        params = list(model.parameters())
        moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
        steps = []
        for step in range(1, STEPS + 1):
            model.zero_grad(set_to_none=True)
            loss = loss_of(model, random_batch(config, 4, 7, 6, seed=seed + step), config.pad_id)
            loss.backward()
            adam_step(params, moments, step)
            steps.append(loss.item())
        losses.append(torch.tensor(steps, dtype=torch.float64))
    return compared(f"{STEPS} Adam steps float64 {mode_of(config)} (losses)", losses[0], losses[1], LOSSES)


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


def masked_batch(config: TransformerConfig, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A padded batch whose row ``MASKED_ROW`` has a source of padding only: every attention row
    over that source (encoder self-attention, cross-attention) is fully masked."""
    batch = random_batch(config, 4, 7, 5, seed=seed)
    src = batch.src.clone()
    src[MASKED_ROW] = config.pad_id
    return src, batch.tgt, padding_mask(src, config.pad_id), batch.tgt_mask


def bad_inputs(spec: str, seed: int) -> Result:
    """A handful of inputs the interface refuses with a TypeError or ValueError before computing."""
    model = build(spec, CONFIG)
    src, tgt, src_mask, tgt_mask = random_batch(CONFIG, seed=seed).inputs()
    too_big, too_long = tgt.clone(), tgt.new_ones(tgt.shape[0], CONFIG.max_seq_len + 1)
    too_big[0, 0] = CONFIG.tgt_vocab_size
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
                  "TypeError or ValueError", "; ".join(wrong))
