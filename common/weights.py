"""Canonical weights: one neutral set of names that every variant maps its parameters to.

A variant declares ``weight_map`` on its model class: one literal dict from canonical name
patterns, written out in full, to its own parameter names, in the style of the rename tables of
Hugging Face conversion scripts (here entries of two variants' maps)::

    # canonical name (docs/architecture.md) -> this variant's parameter
    weight_map: ClassVar[dict[str, str | Param]] = {
        "src_embed.weight": "src_embedding.E",
        "{stack}.layers.{i}.{attn}.wq.weight":
            Param("{stack}.layers.{i}.{attn}.W_q", layout="h d k -> (h k) d"),
        "decoder.layers.{i}.cross_attn.wk.{kind}":
            Param("decoder.layers.{i}.cross_attn.kv_proj.{kind}", chunk=(0, 2)),
        "{stack}.layers.{i}.{norm}.{kind}": "{stack}.layers.{i}.{norm}.{kind}",
        ...
    }

``{field}`` matches one dotted segment of a canonical name and is substituted into the
parameter name; the fields in use are ``{stack}`` (encoder, decoder), ``{i}`` (the layer),
``{attn}`` (self_attn, cross_attn), ``{proj}`` (wq, wk, wv, wo), ``{norm}`` (norm1, ...) and
``{kind}`` (weight, bias). A plain string is a parameter of the canonical layout. ``Param`` says
more only where needed: ``layout`` is an einops pattern from the variant's layout to the
canonical one (``nn.Linear``'s ``(out, in)``); ``chunk=(k, n)`` is the k-th of n row blocks of a
fused parameter such as ``nn.MultiheadAttention.in_proj_weight``. The inverse direction is
derived from the same entry, so one line describes both export and import.

With ``share_embeddings`` (section 3.4) the canonical names ``TIED`` are one matrix: a variant
ties its parameters in its own style, and its map sends the three names to one parameter (by
any of the names it has in the model). Where tying moves a name or layout, as when a generator
applied as ``x @ W`` reads the embedding matrix E as W = Eᵀ, the variant also declares
``tied_weight_map``: the entries that replace ``weight_map``'s under ``share_embeddings``.
A parameter with no canonical name at all (an outside model's learned positions, say) is listed
in ``extra_parameters``: transfers leave it alone. One map serves every config: where the config
leaves a part out (the final norms, ``final_norm=False``), the entries for it are passed over
(``absent_parts``). ``check_weight_map`` names every problem of a
map at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch
from einops import EinopsError, rearrange
from torch import Tensor, nn

from common.config import TransformerConfig

# Fields that give the canonical weights their meaning: the same tensors under another
# value of any of these would be another function (or not fit at all), or, for
# share_embeddings, would silently tie three matrices or untie one.
WEIGHT_FIELDS = ("d_model", "n_heads", "n_layers", "d_ff", "decoder_ff_dim", "src_vocab_size",
                 "tgt_vocab_size", "norm_first", "share_embeddings", "activation", "final_norm",
                 "positions")
_WHY = {"share_embeddings": "a tied model holds one matrix as src_embed.weight, tgt_embed.weight "
                            "and generator.weight, an untied one three; moving weights between "
                            "them would tie three matrices or untie one"}

# One matrix under share_embeddings: the source and target embeddings and the generator's weight.
TIED = ("src_embed.weight", "tgt_embed.weight", "generator.weight")

_ATTENTION = ("wq", "wk", "wv", "wo")
T = TypeVar("T")


@dataclass(frozen=True)
class Param:
    """Where one canonical tensor lives inside a variant."""

    name: str  # the variant's parameter name; may use the {fields} of the canonical pattern
    layout: str | None = None  # einops "variant axes -> canonical axes"; None = same layout
    chunk: tuple[int, int] | None = None  # (index, count): rows of a fused parameter, dim 0


def canonical_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every canonical name and its shape, in a fixed order (docs/architecture.md, "Canonical weights");
    no ``encoder.norm``/``decoder.norm`` under ``final_norm=False``."""
    d = config.d_model
    shapes: dict[str, tuple[int, ...]] = {
        "src_embed.weight": (config.src_vocab_size, d),
        "tgt_embed.weight": (config.tgt_vocab_size, d),
    }

    def attention(prefix: str) -> None:
        for proj in _ATTENTION:
            shapes[f"{prefix}.{proj}.weight"] = (d, d)
            shapes[f"{prefix}.{proj}.bias"] = (d,)

    def feed_forward(prefix: str, f: int) -> None:
        shapes.update({f"{prefix}.w1.weight": (f, d), f"{prefix}.w1.bias": (f,),
                       f"{prefix}.w2.weight": (d, f), f"{prefix}.w2.bias": (d,)})

    def norms(prefix: str, count: int) -> None:
        for n in range(1, count + 1):
            shapes.update({f"{prefix}.norm{n}.weight": (d,), f"{prefix}.norm{n}.bias": (d,)})

    for i in range(config.n_layers):
        attention(f"encoder.layers.{i}.self_attn")
        feed_forward(f"encoder.layers.{i}.ff", config.d_ff)
        norms(f"encoder.layers.{i}", 2)
    if config.final_norm:
        shapes.update({"encoder.norm.weight": (d,), "encoder.norm.bias": (d,)})
    for i in range(config.n_layers):
        attention(f"decoder.layers.{i}.self_attn")
        attention(f"decoder.layers.{i}.cross_attn")
        feed_forward(f"decoder.layers.{i}.ff", config.decoder_ff_dim)
        norms(f"decoder.layers.{i}", 3)
    if config.final_norm:
        shapes.update({"decoder.norm.weight": (d,), "decoder.norm.bias": (d,)})
    shapes.update({"generator.weight": (config.tgt_vocab_size, d),
                   "generator.bias": (config.tgt_vocab_size,)})
    return shapes


def init_canonical(config: TransformerConfig, seed: int) -> dict[str, Tensor]:
    """Seeded float32 weights in canonical form; ``variants.build(..., seed=)`` imports them.

    Each canonical matrix is Xavier-uniform with its own fans, U(-a, a) with
    a = sqrt(6 / (fan_in + fan_out)); every bias is zero, LayerNorm gain one and bias zero, and
    embeddings N(0, 1/d_model) so that after the sqrt(d_model) scaling of section 3.4 a token
    vector has unit variance per feature. This is close to, not the same as, what
    ``torch.nn.Transformer`` does in its ``_reset_parameters`` (``xavier_uniform_`` on every
    parameter with more than one dimension): torch draws the fused ``in_proj_weight``
    (3*d_model, d_model) as one matrix, so its query, key and value blocks get
    a = sqrt(6 / (4*d_model)), sqrt(2) narrower than the sqrt(6 / (2*d_model)) here; and only
    the attention biases are zero there (``MultiheadAttention._reset_parameters``), while the
    feed-forward biases keep ``nn.Linear``'s default U(-1/sqrt(fan_in), 1/sqrt(fan_in)). The
    embeddings and the generator lie outside ``nn.Transformer``. With
    ``share_embeddings`` the source embedding is drawn once and is also the target embedding
    and the generator's weight: one tensor under the three names ``TIED``.
    """
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in canonical_shapes(config).items():
        if config.share_embeddings and name in TIED[1:]:
            tensor = state[TIED[0]]
        elif name.endswith("_embed.weight"):
            tensor = torch.randn(shape, generator=generator) * config.d_model**-0.5
        elif ".norm" in name or name.startswith(("encoder.norm", "decoder.norm")):
            tensor = torch.ones(shape) if name.endswith("weight") else torch.zeros(shape)
        elif len(shape) == 2:
            bound = math.sqrt(6.0 / (shape[0] + shape[1]))
            tensor = (torch.rand(shape, generator=generator) * 2 - 1) * bound
        else:
            tensor = torch.zeros(shape)
        state[name] = tensor
    return state


def export_weights(model: nn.Module) -> dict[str, Tensor]:
    """The model's weights under canonical names and layouts (detached copies; a tied model's
    one matrix is one copy under the three names ``TIED``)."""
    params = dict(model.named_parameters())
    return _tie(model.config, {name: _to_canonical(params[slot.name], slot).detach().clone()
                               for name, slot in _resolve(model).items()})


def export_gradients(model: nn.Module) -> dict[str, Tensor]:
    """The gradients of the model's weights under canonical names (after ``backward``)."""
    params = dict(model.named_parameters())
    missing = [name for name, param in params.items() if param.grad is None]
    if missing:
        raise ValueError(f"no gradient for {missing}; call backward() first")
    return _tie(model.config, {name: _to_canonical(params[slot.name].grad, slot).clone()
                               for name, slot in _resolve(model).items()})


def import_weights(
    model: nn.Module, state: Mapping[str, Tensor], config: TransformerConfig | None = None
) -> None:
    """Load canonical weights into ``model``; all or nothing (``prepare_import``, then
    ``apply_import``)."""
    apply_import(model, prepare_import(model, state, config))


def apply_import(model: nn.Module, values: Mapping[str, Tensor]) -> None:
    """Write what ``prepare_import`` returned into ``model``'s parameters (nothing is checked
    again: a caller that must change several things all or nothing prepares them all first)."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for param_name, value in values.items():
            params[param_name].copy_(value)


def prepare_import(
    model: nn.Module, state: Mapping[str, Tensor], config: TransformerConfig | None = None
) -> dict[str, Tensor]:
    """The new value of each of ``model``'s parameters, by parameter name, from canonical
    weights; checked whole, and nothing is written (``apply_import`` writes them).

    Raises ValueError naming every missing, unexpected, mis-shaped, complex, ``meta`` or
    non-finite key, the names ``TIED`` when the model shares one matrix and they hold different
    ones (nothing is averaged or picked), and, when ``config`` — the exporter's config — is
    given, every field of WEIGHT_FIELDS that differs from the model's; the model is left
    unchanged. Finiteness is checked after the cast to the parameter's dtype and device: 1e6 is
    finite in float32 but inf in float16.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a mapping of canonical names to tensors, got {type(state)}")
    expected = canonical_shapes(model.config)
    slots = _resolve(model)
    params = dict(model.named_parameters())
    problems = []
    if config is not None:
        problems += [f"config field {field}: weights have {getattr(config, field)!r}, "
                     f"model has {getattr(model.config, field)!r}"
                     + (f" ({_WHY[field]})" if field in _WHY else "")
                     for field in WEIGHT_FIELDS
                     if getattr(config, field) != getattr(model.config, field)]
    problems += [f"missing key {name}" for name in expected if name not in state]
    problems += [f"unexpected key {name}" for name in state if name not in expected]
    cast = {}  # canonical name -> its tensor in the destination's dtype, on its device
    for name, tensor in state.items():
        if name not in expected:
            continue
        if not isinstance(tensor, Tensor):
            problems.append(f"key {name}: expected a tensor, got {type(tensor).__name__}")
        elif tuple(tensor.shape) != expected[name]:
            problems.append(f"key {name}: shape {tuple(tensor.shape)}, expected {expected[name]}")
        elif tensor.is_meta:
            problems.append(f"key {name}: a meta tensor, which holds no values")
        elif tensor.is_complex():  # a cast to a real dtype would drop the imaginary part silently
            problems.append(f"key {name}: complex dtype {tensor.dtype}; weights are real")
        else:
            param = params[slots[name].name]
            cast[name] = tensor.detach().to(param.device, param.dtype)
            if param.is_meta or torch.isfinite(cast[name]).all():
                continue  # a meta model holds no values to check
            overflow = bool(torch.isfinite(tensor).all())
            problems.append(f"key {name}: holds NaN or inf" + (
                f" once cast to the model's {param.dtype} (largest finite value "
                f"{torch.finfo(param.dtype).max:.4g})" if overflow else ""))
    if model.config.share_embeddings and not problems:
        problems += _tying_problems(state)
    if problems:
        raise ValueError("cannot import weights:\n  " + "\n  ".join(problems))

    new_values = {}  # parameter name -> its full new value, built before anything is written
    for name, slot in slots.items():
        param = params[slot.name]
        value = new_values.setdefault(slot.name, param.detach().clone())
        _from_canonical(cast[name], slot, value)
    return new_values


def transfer(src_model: nn.Module, dst_model: nn.Module) -> None:
    """Copy every weight of ``src_model`` into ``dst_model``, whatever their variants."""
    import_weights(dst_model, export_weights(src_model), config=src_model.config)


def _tie(config: TransformerConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A tied model's exported matrix, one tensor under the three names ``TIED``."""
    if config.share_embeddings:
        state.update(dict.fromkeys(TIED[1:], state[TIED[0]]))
    return state


def _tying_problems(state: Mapping[str, Tensor]) -> list[str]:
    """The names ``TIED`` that differ from src_embed.weight, for a model that shares one matrix."""
    first = state[TIED[0]]
    differ = [name for name in TIED[1:] if not torch.equal(state[name], first)]
    if not differ:
        return []
    return [f"share_embeddings: the model holds one matrix as {', '.join(TIED)}, but "
            f"{' and '.join(differ)} differ from {TIED[0]}; tied weights must hold one matrix "
            f"under all three names (nothing is averaged or picked)"]


# --- the map machinery ---------------------------------------------------------------------


def check_weight_map(model: nn.Module) -> None:
    """Raise LookupError naming every problem of the model's ``weight_map`` at once: canonical
    names it covers not exactly once, entries that match no canonical name, reach no parameter
    or a tensor of the wrong shape, and parameters it does not fill exactly once."""
    _resolve(model)


def match_patterns(
    table: Mapping[str, T], names: Iterable[str], noun: str = "canonical name", absent: Iterable[str] = ()
) -> tuple[dict[str, tuple[T, dict]], list[str]]:
    """Each name -> (the one entry of ``table`` whose ``{field}`` pattern matches it, the fields).

    Also returns the problems, each a short phrase: names matched by no pattern or by several
    (one phrase per set of patterns), and patterns that match no name (a typo, most likely).
    ``absent``: names of parts the config leaves out (``absent_parts``); an entry that matches
    only those is the map of a part this model lacks, passed over, not a typo.
    """
    names, absent = list(names), list(absent)
    compiled = [(regex, pattern, target) for pattern, target in table.items()
                if not _only_absent(regex := _compile(pattern), names, absent)]
    matched: dict[str, tuple[T, dict]] = {}
    uncovered, several, used = [], [], set()
    for name in names:
        hits = [(regex.fullmatch(name), pattern, target) for regex, pattern, target in compiled]
        hits = [hit for hit in hits if hit[0]]
        used.update(pattern for _, pattern, _ in hits)
        if not hits:
            uncovered.append(name)
        elif len(hits) > 1:
            patterns = tuple(pattern for _, pattern, _ in hits)
            several.append((patterns, f"entries {' and '.join(map(repr, patterns))} all match {name}"))
        else:
            match, _, target = hits[0]
            matched[name] = (target, match.groupdict())
    plural = "" if len(uncovered) == 1 else "s"
    problems = [f"does not cover {len(uncovered)} {noun}{plural}: {', '.join(uncovered)}"] * bool(uncovered)
    problems += first_of_each(several)
    problems += [f"entry {pattern!r} matches no {noun}" for _, pattern, _ in compiled if pattern not in used]
    return matched, problems


def _only_absent(regex: re.Pattern[str], names: list[str], absent: list[str]) -> bool:
    """Whether the entry matches some absent name and no present one: the map of a missing part."""
    return any(map(regex.fullmatch, absent)) and not any(map(regex.fullmatch, names))


def absent_parts(config: TransformerConfig) -> list[str]:
    """The canonical names a model with every part has and ``config`` leaves out: the final norms
    under ``final_norm=False``. A variant's map keeps its entries for them (one map serves every
    config); they are passed over where the part is absent."""
    present = canonical_shapes(config)
    return [name for name in canonical_shapes(config.replace(final_norm=True)) if name not in present]


def first_of_each(problems: Iterable[tuple[object, str]]) -> list[str]:
    """(key, message) pairs -> the first message of each key, with how many more it stands for
    (one misspelt map entry is one problem, however many layers it reaches)."""
    counts: dict[object, list] = {}
    for key, message in problems:
        counts.setdefault(key, [message, 0])[1] += 1
    return [message + (f" (and {count - 1} more like it)" if count > 1 else "")
            for message, count in counts.values()]


def _resolve(model: nn.Module) -> dict[str, Param]:
    """canonical name -> Param with a concrete parameter name, checked to cover the model.

    A parameter is named as ``named_parameters()`` names it: a tied one once, by its first name,
    which every other name it has in the model (``remove_duplicate=False``) resolves to.
    Parameters the class lists in ``extra_parameters`` have no canonical name: they are neither
    exported nor imported, and keep the model's own values (an outside model's learned
    positions, say).
    """
    cls = type(model)
    tied = model.config.share_embeddings
    weight_map = {**cls.weight_map, **(getattr(cls, "tied_weight_map", {}) if tied else {})}
    shapes = canonical_shapes(model.config)
    matched, problems = match_patterns(weight_map, shapes, absent=absent_parts(model.config))
    params = dict(model.named_parameters())
    first_name = {id(param): name for name, param in params.items()}
    names = {name: first_name[id(param)]
             for name, param in model.named_parameters(remove_duplicate=False)}
    resolved: dict[str, Param] = {}
    chunks_used: dict[str, list] = {}  # parameter name -> the chunks of it that the map fills
    wrong = []  # (the entry's target, what is wrong)
    for name, (target, fields) in matched.items():
        slot = target if isinstance(target, Param) else Param(target)
        target = slot.name.format(**fields)
        if target not in names:
            wrong.append((slot.name, f"sends {name} to {target}, which the model lacks"))
            continue
        template = slot.name
        slot = resolved[name] = Param(names[target], slot.layout, slot.chunk)
        wrong += [(template, why) for why in _shape_problems(name, shapes[name], params[slot.name], slot)]
        if not (tied and name in TIED[1:]):  # the one tied matrix is filled once
            chunks_used.setdefault(slot.name, []).append(slot.chunk)
    problems += first_of_each(wrong)
    if problems:
        raise LookupError(f"{cls.__name__}.weight_map " + "; ".join(problems))
    if tied and len({resolved[name] for name in TIED}) != 1:
        raise LookupError(f"share_embeddings: {cls.__name__}.weight_map must send {', '.join(TIED)} "
                          f"to one parameter, but they reach {[resolved[n] for n in TIED]}")
    extra = set(getattr(cls, "extra_parameters", ()))
    uncovered = [p for p in params if p not in extra and not _covers_once(chunks_used.get(p, []))]
    if uncovered:
        raise LookupError(f"weight_map covers these parameters not exactly once: {uncovered}")
    return resolved


def _shape_problems(name: str, shape: tuple[int, ...], param: Tensor, slot: Param) -> list[str]:
    """Why the piece of ``param`` that ``slot`` names cannot hold canonical ``name``, if it cannot
    (worked out on the meta device: nothing is copied)."""
    try:
        got = tuple(_to_canonical(torch.empty(param.shape, device="meta"), slot).shape)
    except EinopsError as error:
        return [f"sends {name} to {slot.name} with layout {slot.layout!r}: {str(error).splitlines()[0]}"]
    if got != shape:
        return [f"sends {name} ({', '.join(map(str, shape))}) to {slot.name}, which holds "
                f"({', '.join(map(str, got))})"]
    return []


def _covers_once(chunks: list[tuple[int, int] | None]) -> bool:
    """Filled whole once, or every chunk of it once."""
    if chunks == [None]:
        return True
    if not chunks or None in chunks:
        return False
    count = chunks[0][1]
    return sorted(chunks) == [(k, count) for k in range(count)]


def _compile(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"\{(\w+)\}", pattern)
    # even positions are literal text, odd positions are field names
    return re.compile("".join(re.escape(p) if k % 2 == 0 else f"(?P<{p}>[^.]+)"
                              for k, p in enumerate(parts)))


def _chunk_view(param: Tensor, slot: Param) -> Tensor:
    if slot.chunk is None:
        return param
    index, count = slot.chunk
    return param.chunk(count, dim=0)[index]


def _to_canonical(param: Tensor, slot: Param) -> Tensor:
    piece = _chunk_view(param, slot)
    return piece if slot.layout is None else rearrange(piece, slot.layout)


def _from_canonical(tensor: Tensor, slot: Param, value: Tensor) -> None:
    """Write canonical ``tensor`` into ``value`` (the variant's full parameter) in place."""
    piece = _chunk_view(value, slot)
    if slot.layout is not None:
        variant_axes, canonical_axes = slot.layout.split("->")
        # The variant side names plain axes only, so its shape gives every axis length.
        sizes = dict(zip(variant_axes.split(), piece.shape, strict=True))
        tensor = rearrange(tensor, f"{canonical_axes} -> {variant_axes}", **sizes)
    piece.copy_(tensor)
