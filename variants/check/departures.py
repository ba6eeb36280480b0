"""The departures ``variants.check.explain`` tries at a point: each sublayer recomputed in float64
from the canonical weights and the values at the points before it, once as the reference computes
it (first) and once under each classic departure: ``RECOMPUTE[kind](point, values, weights,
config, inputs) -> [(cause, value)]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common import positions
from common.config import TransformerConfig
from common.masks import causal_mask, padding_mask

EPS_TRIED = (1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10, 1e-12, 0.0)
EPS_NAMES = {1e-5: "nn.LayerNorm's default", 1e-12: "BERT's", 1e-6: "the paper's implementations'"}


def _number(value: float) -> str:
    return f"{value:.3g}"


# --- what feeds each point ---------------------------------------------------------------------


def _layer_input(values: dict[str, Tensor], stack: str, i: int) -> Tensor:
    if i == 0:
        return values["src_embed" if stack == "encoder" else "tgt_embed"]
    return values[f"{stack}.layers.{i - 1}"]


def stack_output(values: dict[str, Tensor], stack: str, config: TransformerConfig) -> Tensor:
    """What a stack hands on: its final norm's output, or its last layer's where it has none."""
    return values.get(f"{stack}.norm", values[f"{stack}.layers.{config.n_layers - 1}"])


def norm_input(point: str, values: dict[str, Tensor], config: TransformerConfig) -> Tensor:
    """What the LayerNorm at ``point`` normalises, from the values at the points before it."""
    if point in ("encoder.norm", "decoder.norm"):
        return values[f"{point.partition('.')[0]}.layers.{config.n_layers - 1}"]
    stack, _, i, n = point.split(".")
    i, n = int(i), int(n[4:])
    prefix = f"{stack}.layers.{i}"
    sublayers = ("self_attn", "ff") if stack == "encoder" else ("self_attn", "cross_attn", "ff")
    x = _layer_input(values, stack, i)
    if config.norm_first:  # the residual stream before sublayer n
        return x + sum((values[f"{prefix}.{name}"] for name in sublayers[: n - 1]), torch.zeros_like(x))
    before = x if n == 1 else values[f"{prefix}.norm{n - 1}"]
    return before + values[f"{prefix}.{sublayers[n - 1]}"]


def sublayer_input(point: str, values: dict[str, Tensor], config: TransformerConfig) -> Tensor:
    """The (query) input of the attention or feed-forward at ``point``."""
    stack, _, i, name = point.split(".")
    prefix = f"{stack}.layers.{i}"
    order = ("self_attn", "ff") if stack == "encoder" else ("self_attn", "cross_attn", "ff")
    n = order.index(name)
    if config.norm_first:
        return values[f"{prefix}.norm{n + 1}"]
    return _layer_input(values, stack, int(i)) if n == 0 else values[f"{prefix}.norm{n}"]


# --- the recomputations: [(cause, value)], the first as the reference computes it ---------------

Recompute = Callable[[str, dict, dict, TransformerConfig, tuple], list[tuple[str, Tensor | None]]]


def attention(point: str, values: dict[str, Tensor], weights: dict[str, Tensor], config: TransformerConfig,
              inputs: tuple[Tensor, ...]) -> list[tuple[str, Tensor | None]]:
    _, tgt, src_mask, tgt_mask = inputs
    query = sublayer_input(point, values, config)
    cross = point.endswith("cross_attn")
    context = stack_output(values, "encoder", config) if cross else query
    mask = src_mask if cross or point.startswith("encoder") else tgt_mask
    w = {proj: (weights[f"{point}.{proj}.weight"], weights[f"{point}.{proj}.bias"])
         for proj in ("wq", "wk", "wv", "wo")}
    d, h = config.d_model, config.n_heads
    dk = d // h

    def run(scale: float = dk ** -0.5, drop: str = "", swap: bool = False, use_mask: Tensor | None = mask,
            invert: bool = False, dim: int = -1, transpose: bool = True) -> Tensor:
        def project(x: Tensor, proj: str) -> Tensor:
            weight, bias = w[proj]
            return F.linear(x, weight, None if proj == drop else bias)

        def split(x: Tensor) -> Tensor:  # (B, L, D) -> (B, H, L, dk)
            if transpose:
                return x.view(x.shape[0], -1, h, dk).transpose(1, 2)
            return x.view(x.shape[0], h, -1, dk)

        q = split(project(query, "wq"))
        k = split(project(context, "wv" if swap else "wk"))
        v = split(project(context, "wk" if swap else "wv"))
        scores = q @ k.transpose(-2, -1) * scale
        if use_mask is not None:
            scores = scores.masked_fill(use_mask if invert else ~use_mask, torch.finfo(scores.dtype).min)
        out = scores.softmax(dim) @ v  # (B, H, Lq, dk)
        out = out.transpose(1, 2).reshape(query.shape) if transpose else out.reshape(query.shape)
        return project(out, "wo")

    ref = f"where the reference divides by √d_k = √{dk}"
    scales = {  # the model's scale of the scores -> what it is
        f"the scores are divided by √d_model = √{d} {ref}: a factor √H = √(d_model/d_k) = "
        f"{_number(math.sqrt(h))} smaller": d ** -0.5,
        f"the scores are not scaled, {ref}: a factor √d_k = {_number(math.sqrt(dk))} larger": 1.0,
        f"the scores are divided by d_k = {dk} {ref}: a factor √d_k = {_number(math.sqrt(dk))} "
        f"smaller": 1 / dk,
        f"the scores are divided by d_model = {d} {ref}: a factor d_model/√d_k = "
        f"{_number(d / math.sqrt(dk))} smaller": 1 / d,
        f"the scores are multiplied by √d_k = √{dk} {ref}: a factor d_k = {dk} larger": dk ** 0.5,
    }
    tried: list[tuple[str, Tensor | None]] = [("as the reference", run())]
    tried += [(cause, run(scale=scale)) for cause, scale in scales.items()]
    tried += [(f"the {name} projection's bias left out (W_{proj[1]} without its bias)", run(drop=proj))
              for proj, name in (("wq", "query"), ("wv", "value"), ("wo", "output"))]
    tried.append(("keys projected with W_v and values with W_k", run(swap=True)))
    if mask is not None:
        tried.append(("no mask applied", run(use_mask=None)))
        tried.append(("the mask read inverted (True taken as blocked)", run(invert=True)))
    if point.startswith("decoder") and not cross:
        tried.append(("the causal mask left out: padding only",
                      run(use_mask=padding_mask(tgt, config.pad_id))))
        tried.append(("the padding mask left out: causal only",
                      run(use_mask=causal_mask(tgt.shape[1], device=tgt.device))))
    tried.append(("the softmax over the queries (dim=-2), not the keys", run(dim=-2)))
    tried.append(("heads split with .view(B, H, L, d_k), without the transpose", run(transpose=False)))
    return tried


def layer_norm(point: str, values: dict[str, Tensor], weights: dict[str, Tensor], config: TransformerConfig,
               inputs: tuple[Tensor, ...]) -> list[tuple[str, Tensor | None]]:
    x = norm_input(point, values, config)
    gain, shift = weights[f"{point}.weight"], weights[f"{point}.bias"]
    eps = config.norm_eps
    centred = x - x.mean(-1, keepdim=True)
    variance = x.var(-1, unbiased=False, keepdim=True)

    def norm(scaled: Tensor, use_gain: bool = True, use_shift: bool = True) -> Tensor:
        return scaled * (gain if use_gain else 1) + (shift if use_shift else 0)

    tried: list[tuple[str, Tensor | None]] = [("as the reference", norm(centred / (variance + eps).sqrt()))]
    for other in [e for e in EPS_TRIED if e != eps] + [_fitted_eps(x, values, point, gain, shift)]:
        if other is None or other < 0:
            continue
        name = f" ({EPS_NAMES[other]})" if other in EPS_NAMES else ""
        tried.append((f"LayerNorm eps {other:.2g}{name} where the reference's is {eps:g}",
                      norm(centred / (variance + other).sqrt())))
    unbiased = x.var(-1, unbiased=True, keepdim=True)
    tried += [
        ("the unbiased variance (n − 1; torch.var's default) in the LayerNorm",
         norm(centred / (unbiased + eps).sqrt())),
        ("(x − mean) / (std + eps): the unbiased std (torch.std's default), eps outside the root",
         norm(centred / (unbiased.sqrt() + eps))),
        ("(x − mean) / (std + eps): eps outside the root", norm(centred / (variance.sqrt() + eps))),
        ("no mean subtracted (an RMSNorm)", norm(x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt())),
        ("the LayerNorm's shift (bias) left out", norm(centred / (variance + eps).sqrt(), use_shift=False)),
        ("the LayerNorm's gain (weight) left out", norm(centred / (variance + eps).sqrt(), use_gain=False)),
        ("no LayerNorm here: the value is its input, unnormalised", x),
    ]
    return tried


def _fitted_eps(x: Tensor, values: dict[str, Tensor], point: str, gain: Tensor, shift: Tensor,
                ) -> float | None:
    """The eps that turns ``x`` into the model's value at ``point`` (biased variance, eps inside
    the root), read per row where the centred input and the gain are largest; the median."""
    y = values.get(point)
    if y is None:
        return None
    centred = x - x.mean(-1, keepdim=True)
    variance = x.var(-1, unbiased=False, keepdim=True)
    index = (centred.abs() * gain.abs()).argmax(-1, keepdim=True)
    normalised = ((y - shift) / gain).gather(-1, index)
    root = centred.gather(-1, index) / normalised
    eps = (root.pow(2) - variance).flatten()
    eps = eps[torch.isfinite(eps)]
    return float(eps.median()) if eps.numel() else None


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "ReLU": F.relu, "GELU": F.gelu, "GELU (tanh approximation)": lambda t: F.gelu(t, approximate="tanh"),
    "SiLU": F.silu}
CONFIG_ACTIVATIONS = {"relu": "ReLU", "gelu": "GELU", "silu": "SiLU"}  # TransformerConfig.activation


def feed_forward(point: str, values: dict[str, Tensor], weights: dict[str, Tensor], config: TransformerConfig,
                 inputs: tuple[Tensor, ...]) -> list[tuple[str, Tensor | None]]:
    x = sublayer_input(point, values, config)
    w1, b1, w2, b2 = (weights[f"{point}.{name}"] for name in ("w1.weight", "w1.bias", "w2.weight", "w2.bias"))
    own = CONFIG_ACTIVATIONS[getattr(config, "activation", "relu")]

    def run(activation: str = own, first: bool = True, second: bool = True) -> Tensor:
        hidden = ACTIVATIONS[activation](F.linear(x, w1, b1 if first else None))
        return F.linear(hidden, w2, b2 if second else None)

    return [("as the reference", run()),
            *((f"{name} where the reference has {own}", run(name)) for name in ACTIVATIONS if name != own),
            ("the first linear's bias left out", run(first=False)),
            ("the second linear's bias left out", run(second=False))]


def embeddings(point: str, values: dict[str, Tensor], weights: dict[str, Tensor], config: TransformerConfig,
               inputs: tuple[Tensor, ...]) -> list[tuple[str, Tensor | None]]:
    ids = inputs[0] if point == "src_embed" else inputs[1]
    length, d = ids.shape[1], config.d_model
    table = F.embedding(ids, weights[f"{point}.weight"])
    tables = position_tables(None, config, length)
    own = tables[""]
    scale = math.sqrt(d)
    return [("as the reference", table * scale + own),
            (f"the embeddings not scaled by √d_model = √{d}", table + own),
            ("no positions added", table * scale),
            ("the positions scaled by √d_model too: (E[ids] + PE)·√d_model", (table + own) * scale),
            *((layout, table * scale + rows) for layout, rows in tables.items() if layout),
            *((f"a LayerNorm (eps {eps:g}, gain 1, shift 0) on the embeddings before the first layer",
               F.layer_norm(table * scale + own, (d,), eps=eps)) for eps in sorted({config.norm_eps, 1e-5}))]


def position_tables(model: nn.Module | None, config: TransformerConfig, length: int) -> dict[str, Tensor]:
    """The position tables tried, (length, D) float64, by how they depart from the reference's
    ("" for the reference's own): [sin | cos] halves, counted from 1, counted from 2 (fairseq's
    offset), and the rows of each (max_len, D) parameter of ``model``'s ``extra_parameters``."""
    d = config.d_model
    sinusoids = positions.sinusoid_table(length + 2, d)
    own = (positions.position_table(config)[:length] if hasattr(positions, "position_table")
           and hasattr(config, "positions") else sinusoids[:length])
    position = torch.arange(length, dtype=torch.float64)[:, None]
    angle = position / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    halves = torch.cat([angle.sin(), angle.cos()], dim=-1)  # sin in the first half, cos in the second
    tables = {"": own,
              "the positions laid out as [sin | cos] halves, not interleaved": halves,
              "the positions counted from 1, not 0": sinusoids[1: length + 1],
              "the positions counted from 2 (fairseq's padding_idx + 1), not 0": sinusoids[2: length + 2]}
    if model is not None:
        params = dict(model.named_parameters())
        for name in getattr(type(model), "extra_parameters", ()):
            rows = params.get(name)
            if rows is not None and rows.ndim == 2 and rows.shape[0] >= length and rows.shape[1] == d:
                learned = f"the positions learned: rows of the model's own {name}"
                tables[learned] = rows.detach().double()[:length]
    return tables


def learned_positions(model: nn.Module, point: str, weights: dict[str, Tensor], inputs: tuple[Tensor, ...],
                      ) -> list[tuple[str, Tensor | None]]:
    """The embeddings plus the first rows of a table of the model's own (its ``extra_parameters``,
    the parameters with no canonical name): learned positions, scaled or not."""
    ids = inputs[0] if point == "src_embed" else inputs[1]
    length, d = ids.shape[1], model.config.d_model
    table = F.embedding(ids, weights[f"{point}.weight"])
    params = dict(model.named_parameters())
    tried = []
    for name in getattr(type(model), "extra_parameters", ()):
        rows = params.get(name)
        if rows is None or rows.ndim != 2 or rows.shape[0] < length or rows.shape[1] != d:
            continue
        rows = rows.detach().double()[:length]
        tried += [(f"learned positions: rows of the model's own {name} added where the reference adds the "
                   f"sinusoids", table * math.sqrt(d) + rows),
                  (f"learned positions ({name}) added to embeddings not scaled by √d_model = √{d}",
                   table + rows)]
    return tried


def generator(point: str, values: dict[str, Tensor], weights: dict[str, Tensor], config: TransformerConfig,
              inputs: tuple[Tensor, ...]) -> list[tuple[str, Tensor | None]]:
    hidden = stack_output(values, "decoder", config)
    logits = F.linear(hidden, weights["generator.weight"], weights["generator.bias"])
    unbiased = F.linear(hidden, weights["generator.weight"])
    return [("as the reference", logits.log_softmax(-1)),
            ("logits, not log-probabilities: no log_softmax at the end", logits),
            ("probabilities (softmax), not log-probabilities", logits.softmax(-1)),
            ("the generator's bias left out", unbiased.log_softmax(-1))]


RECOMPUTE: dict[str, Recompute] = {"attention": attention, "norm": layer_norm, "ff": feed_forward,
                                   "embed": embeddings, "generator": generator}
