"""Why a point diverges: the classic departures tried on the first point the finder names, and the
one that fits said with its evidence.

Everything before the first divergence agrees, so the sublayer at that point got the same inputs
in both models. The checker recomputes it in float64 from the canonical weights, once as the
reference computes it (from the reference's own inputs, which must give back the reference's
value, or nothing is claimed) and once under each classic departure, from the inputs the model
itself computed. A departure fits where its recomputation meets the model's value within the
check's tolerance (and the float32 rounding seen there), at least ten times closer than the
reference: that departure is named, with the two distances as its evidence. The departures:

- attention: the scores scaled by another constant (√d_model for √d_k, none, d_k, ...; the
  factor named and what it equals), a projection's bias left out, keys and values projected
  with each other's matrix, the mask left out, read inverted, or (decoder self-attention) only
  its padding or only its causal part, the softmax over the queries, heads split without the
  transpose;
- LayerNorm: another eps (the usual ones, then fitted from the values), the unbiased variance,
  the std with eps outside the root (biased or unbiased), no mean (RMSNorm), no gain or no shift,
  not applied at all (a final norm the model does not have);
- feed-forward: GELU (exact or tanh) or SiLU for ReLU, a bias left out;
- embeddings: not scaled by √d_model, the positions left out, scaled too, laid out as
  [sin | cos] halves, counted from 1 or 2 (fairseq's offset), or learned (a table of the model's
  own ``extra_parameters``), a LayerNorm before the first layer;
- generator: logits or probabilities for log-probabilities, the bias left out.

Then a wrong map (``variants.check.combined``): another norm's weights in a norm's slot, W_q and
W_k exchanged, self- and cross-attention exchanged, the heads permuted; where no single departure
fits, two together (LayerNorm pairs; the embeddings' and the positions' scales fitted). Of
several that fit, the closest is named. The recomputations are ``variants.check.departures``.

A float32 table or parameter is not a departure of structure: the finder's precision note names
it (``variants.check.divergence``). Swapped decoder masks are found where they break the model
(``variants.check.battery``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from torch import Tensor, nn

from common.probes import Probe, capture
from common.weights import export_weights
from variants.check.combined import pairs, wrong_maps
from variants.check.departures import RECOMPUTE, learned_positions
from variants.check.divergence import ROUNDING_FACTOR, PointDifference, number

FIT = 10.0  # a departure fits only this many times closer to the model than the reference is


@dataclass(frozen=True)
class Explanation:
    """What the model computes at ``point`` instead, and how well that fits."""

    point: str
    cause: str  # what the model does there, one phrase
    fit: float  # max |model - recomputed under the cause|
    before: float  # max |model - reference| at the point
    tried: int  # how many departures were tried

    def line(self) -> str:
        return (f"explained: {self.cause}; recomputed so, {self.point} matches the model to "
                f"{number(self.fit)} (the reference is {number(self.before)} away)")


def explain(subject: nn.Module, reference: nn.Module, inputs: tuple[Tensor, ...],
            stand_ins: tuple[dict[str, Probe], dict[str, Probe]], first: PointDifference,
            tolerance: float) -> Explanation | str:
    """The departure that explains ``first`` (both models float64, holding the same canonical
    weights, run on ``inputs``), or a line saying what was tried and did not fit."""
    config = subject.config
    kind = kind_of(first.point)
    if kind is None or first.max_abs is None or not math.isfinite(first.max_abs):
        return ""
    model = capture(subject, inputs, stand_ins[0])
    ref = capture(reference, inputs, stand_ins[1])
    if first.point not in model or first.point not in ref or \
            model[first.point].shape != ref[first.point].shape:
        return ""
    weights = {name: tensor.double() for name, tensor in export_weights(reference).items()}
    value = model[first.point]
    before = (value - ref[first.point]).abs().max().item()
    limit = max(tolerance, ROUNDING_FACTOR * first.rounding if first.float32_seen and first.rounding else 0.0)

    def fitting(tried: list[tuple[str, Tensor | None]]) -> list[tuple[float, str]]:
        fits = []
        for cause, recomputed in tried:
            if recomputed is None or recomputed.shape != value.shape:
                continue
            fit = (value - recomputed).abs().max().item()
            if fit <= limit and fit * FIT <= before:
                fits.append((fit, cause))
        return fits

    try:
        exact = RECOMPUTE[kind](first.point, ref, weights, config, inputs)[0][1]
        if not (exact - ref[first.point]).abs().max().item() <= max(tolerance, 1e-9):
            return ""  # the reference is not what this module computes: claim nothing
        tried = RECOMPUTE[kind](first.point, model, weights, config, inputs)[1:]
        if kind == "embed":
            tried += learned_positions(subject, first.point, weights, inputs)
        tried += wrong_maps(kind, first.point, model, weights, config, inputs, subject)
        fits = fitting(tried)
        if not fits:  # no single departure: two together
            together = pairs(kind, first.point, model, weights, config, inputs, subject)
            tried += together
            fits = fitting(together)
    except (KeyError, RuntimeError):
        return ""
    if not fits:
        return (f"not explained by the {len(tried)} classic departures, wrong maps and pairs of departures "
                f"tried at {first.point} ({KIND_NAMES[kind]}; docs/check.md lists them)")
    fit, cause = min(fits, key=closeness)
    return Explanation(first.point, cause, fit, before, len(tried))


def closeness(found: tuple[float, str]) -> float:
    """How far a fitting departure's recomputation lies from the model: the closest is named."""
    return found[0]


KIND_NAMES = {"attention": "scale, biases, keys and values, masks, softmax axis, head split, W_q/W_k, "
                           "heads permuted",
              "norm": "eps, variance, std, RMSNorm, gain, shift, not applied, another norm's weights, pairs",
              "ff": "activation, biases", "embed": "√d_model, positions, a LayerNorm, fitted scales",
              "generator": "logits, probabilities, bias"}


def kind_of(point: str) -> str | None:
    """What a point is: "embed", "attention", "norm", "ff", "generator" (final norms
    included in "norm"); None for a whole layer's output."""
    if point.endswith("_embed"):
        return "embed"
    if point == "generator":
        return point
    last = point.rpartition(".")[2]
    if last in ("self_attn", "cross_attn"):
        return "attention"
    if last == "ff":
        return "ff"
    if re.fullmatch(r"norm\d?", last):
        return "norm"
    return None


