"""The two models a check compares, built alike: the battery's config and shapes, a forward
``Case``, a check's ``Result``, the seeded weights (``battery_weights``), ``pair`` (both models
holding them), the norm modes a class supports, and ``compared`` (two outputs within a tolerance).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.config import TransformerConfig
from common.random_batch import Batch
from common.weights import import_weights, init_canonical
from variants import SpecError, build
from variants.check.adapter import absent_weights
from variants.check.outside import NORM_MODES
from variants.check.tolerances import FLOAT32, FLOAT64, Tolerance

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


def pair(spec: str, against: str, config: TransformerConfig, seed: int,
         against_config: TransformerConfig | None = None) -> tuple[nn.Module, nn.Module]:
    """``spec`` and ``against`` built for ``config`` (``against`` for ``against_config`` where
    given: the other norm mode) with the same weights, float32, eval mode. Parameters outside the
    canonical set (``extra_parameters``) get the same draw every run; the biases ``spec`` declares
    absent are zero in both."""
    state = battery_weights(config, seed)
    models = []
    for name, built_for in ((spec, config), (against, against_config or config)):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build(name, built_for)
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
