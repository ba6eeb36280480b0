"""What ``variants.check.explain`` tries at a point beyond the single classic departures
(``variants.check.departures``): a wrong map, and two departures together.

- a wrong map: the point computed with another module's weights in its slot, as a weight map that
  sends it to the wrong module computes it: a LayerNorm with another norm's gain and shift (norms
  placed in registration order, not call order), W_q and W_k exchanged, a decoder layer's
  self-attention and cross-attention exchanged, the heads of W_q, W_k and W_v in reverse order
  against W_o's columns;
- two departures together, where no single one fits: at a LayerNorm every pair of another eps,
  another variance or std, no mean, no gain, no shift; at the embeddings, the scale of the
  embeddings and of the positions fitted (least squares) for each position table tried, named
  where at least two depart (the embeddings not scaled by √d_model *and* the positions scaled by
  a learned scalar, which together scale the reference's embeddings).

Each returns ``[(cause, value)]`` as the departures do.
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.config import TransformerConfig
from common.weights import canonical_shapes, match_patterns
from variants.check.departures import EPS_NAMES, EPS_TRIED, RECOMPUTE, norm_input, position_tables

Tried = list[tuple[str, Tensor | None]]
BOTH = ("weight", "bias")


def wrong_maps(kind: str, point: str, values: dict[str, Tensor], weights: dict[str, Tensor],
               config: TransformerConfig, inputs: tuple[Tensor, ...], model: nn.Module | None = None,
               ) -> Tried:
    """``point`` recomputed as the reference would with another module's weights in its slot; where
    ``model``'s weight map says which of its parameters each slot takes, the exchanged targets."""
    def with_weights(changed: dict[str, Tensor]) -> Tensor:
        return RECOMPUTE[kind](point, values, {**weights, **changed}, config, inputs)[0][1]

    tried: Tried = []
    for family, slot, other in exchanges(kind, point, weights):
        if family == "norms":
            cause = (f"{point} holds {other}'s gain and shift: a weight map that sends {point} to {other}'s "
                     f"module (norms drafted in registration order, not the order the layer calls them?)"
                     f"{exchange(model, f'{point}.weight', f'{other}.weight', config)}")
        elif family == "W_q/W_k":
            cause = ("W_q and W_k exchanged: a weight map that sends wq to the keys' linear and wk to the "
                     "queries'" + exchange(model, f"{slot}.weight", f"{other}.weight", config))
        else:
            cause = (f"{point} holds {other}'s weights: a weight map that exchanges the decoder's "
                     f"self-attention and cross-attention")
        tried.append((cause, with_weights(exchanged(weights, slot, other))))
    if kind == "attention":
        heads, size = config.n_heads, config.d_model // config.n_heads
        if heads > 1:
            order = torch.arange(config.d_model).view(heads, size).flip(0).flatten()
            tried.append(("the heads of W_q, W_k and W_v in reverse order against W_o's columns: a weight "
                          "map that permutes the heads",
                          with_weights({f"{point}.{p}.{k}": weights[f"{point}.{p}.{k}"][order]
                                        for p in ("wq", "wk", "wv") for k in BOTH})))
    return tried


def exchanges(kind: str, point: str, names) -> list[tuple[str, str, str]]:
    """The slots a wrong map may have exchanged at ``point``, each pair's parameters alike in
    shape: (family, slot, other slot), ``names`` the canonical names there are. A LayerNorm and
    every other norm ("norms"); an attention's W_q and W_k ("W_q/W_k"); a decoder layer's
    self-attention and cross-attention ("self/cross")."""
    if kind == "norm":
        norms = {name[: -len(".weight")] for name in names if re.search(r"\.norm\d?\.weight$", name)}
        return [("norms", point, other) for other in sorted(norms - {point})]
    if kind != "attention":
        return []
    found = [("W_q/W_k", f"{point}.wq", f"{point}.wk")]
    if point.startswith("decoder."):
        layer, _, own = point.rpartition(".")
        found.append(("self/cross", point, f"{layer}.{'cross_attn' if own == 'self_attn' else 'self_attn'}"))
    return found


def exchanged(table: dict, slot: str, other: str) -> dict:
    """``table`` (canonical names or points -> anything) with what ``slot`` and ``other`` hold
    exchanged: the entry named by each and every entry under it."""
    out = dict(table)
    for name in table:
        for mine, theirs in ((slot, other), (other, slot)):
            if name == mine or name.startswith(mine + "."):
                twin = theirs + name[len(mine):]
                if twin in table:
                    out[name] = table[twin]
    return out


def exchange(model: nn.Module | None, first: str, second: str, config: TransformerConfig) -> str:
    """The map that fits, where ``model``'s weight map names the parameters ``first`` and
    ``second`` (canonical names) take: each sent to the other's target; "" where it cannot say."""
    table = getattr(type(model), "weight_map", None) if model is not None else None
    if not isinstance(table, dict):
        return ""
    matched, _ = match_patterns(table, canonical_shapes(config))
    targets = []
    for name in (first, second):
        target, fields = matched.get(name, (None, {}))
        text = target if isinstance(target, str) else getattr(target, "name", None)
        if not text:
            return ""
        targets.append(text.format(**fields))
    return (f"; the map that fits sends {first} to {targets[1]!r} and {second} to {targets[0]!r} "
            f"(their biases alike)")


def pairs(kind: str, point: str, values: dict[str, Tensor], weights: dict[str, Tensor],
          config: TransformerConfig, inputs: tuple[Tensor, ...], model: nn.Module) -> Tried:
    """Two departures together at ``point`` (a LayerNorm or the embeddings); [] elsewhere."""
    if kind == "norm":
        return norm_pairs(point, values, weights, config)
    if kind == "embed":
        return embedding_fits(point, values, weights, config, inputs, model)
    return []


NORM_FORMS = ("", "the unbiased variance (n − 1)", "(x − mean) / (std + eps): eps outside the root",
              "(x − mean) / (unbiased std + eps)", "no mean subtracted (an RMSNorm)")


def norm_pairs(point: str, values: dict[str, Tensor], weights: dict[str, Tensor], config: TransformerConfig,
               ) -> Tried:
    """Every pair of LayerNorm departures: another eps, another form, no gain, no shift."""
    x = norm_input(point, values, config)
    gain, shift = weights[f"{point}.weight"], weights[f"{point}.bias"]
    centred = x - x.mean(-1, keepdim=True)
    biased, unbiased = x.var(-1, unbiased=False, keepdim=True), x.var(-1, unbiased=True, keepdim=True)

    def normalised(form: str, eps: float) -> Tensor:
        if form == NORM_FORMS[1]:
            return centred / (unbiased + eps).sqrt()
        if form == NORM_FORMS[2]:
            return centred / (biased.sqrt() + eps)
        if form == NORM_FORMS[3]:
            return centred / (unbiased.sqrt() + eps)
        if form == NORM_FORMS[4]:
            return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
        return centred / (biased + eps).sqrt()

    tried: Tried = []
    for form in NORM_FORMS:
        for eps in (config.norm_eps, *(e for e in EPS_TRIED if e != config.norm_eps)):
            for use_gain in (True, False):
                for use_shift in (True, False):
                    parts = [form,
                             f"eps {eps:.2g}{f' ({EPS_NAMES[eps]})' if eps in EPS_NAMES else ''} where the "
                             f"reference's is {config.norm_eps:g}" if eps != config.norm_eps else "",
                             "" if use_gain else "no gain (weight)", "" if use_shift else "no shift (bias)"]
                    parts = [part for part in parts if part]
                    if len(parts) != 2:
                        continue
                    value = normalised(form, eps) * (gain if use_gain else 1) + (shift if use_shift else 0)
                    tried.append((f"two departures together in the LayerNorm: {parts[0]}, and {parts[1]}",
                                  value))
    return tried


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def embedding_fits(point: str, values: dict[str, Tensor], weights: dict[str, Tensor],
                   config: TransformerConfig, inputs: tuple[Tensor, ...], model: nn.Module) -> Tried:
    """value ≈ a·E[ids] + b·P for each position table P tried, a and b fitted by least squares;
    named where at least two things depart (the scale of E, the table, the scale of P)."""
    ids = inputs[0] if point == "src_embed" else inputs[1]
    value, d = values[point].double(), config.d_model
    table = F.embedding(ids, weights[f"{point}.weight"])
    root = math.sqrt(d)
    scalars = {name: param.item() for name, param in model.named_parameters()
               if name in getattr(type(model), "extra_parameters", ()) and param.numel() == 1}
    tried: Tried = []
    for layout, rows in position_tables(model, config, ids.shape[1]).items():
        rows = rows.expand_as(table)
        gram = torch.tensor([[(table * table).sum(), (table * rows).sum()],
                             [(table * rows).sum(), (rows * rows).sum()]], dtype=torch.float64)
        target = torch.tensor([(table * value).sum(), (rows * value).sum()], dtype=torch.float64)
        try:
            a, b = torch.linalg.solve(gram, target).tolist()
        except RuntimeError:  # a singular fit (no positions, say): nothing to name
            continue
        parts = [_scale_of_embeddings(a, root, d), layout, _scale_of_positions(b, root, scalars)]
        parts = [part for part in parts if part]
        if len(parts) < 2:
            continue
        together = (f" (together the reference's embeddings times {b:.3g})"
                    if layout == "" and not _close(b, 1) and _close(a / root, b) else "")
        tried.append((f"two departures together at the embeddings: {'; and '.join(parts)}{together}",
                      a * table + b * rows))
    return tried


def _scale_of_embeddings(a: float, root: float, d: int) -> str:
    if _close(a, root):
        return ""
    if _close(a, 1.0):
        return f"the embeddings not scaled by √d_model = √{d}"
    return f"the embeddings scaled by {a:.3g} where the reference scales them by √d_model = {root:.3g}"


def _scale_of_positions(b: float, root: float, scalars: dict[str, float]) -> str:
    if _close(b, 1.0):
        return ""
    if _close(b, 0.0):
        return "no positions added"
    named = {1 / root: f"1/√d_model = {1 / root:.3g}", root: f"√d_model = {root:.3g}"}
    what = next((text for value, text in named.items() if _close(b, value)), f"{b:.3g}")
    own = next((f" (the value the model's own {name} holds)" for name, value in scalars.items()
                if _close(value, b)), "")
    return f"the positions scaled by {what}{own}"
