"""Reading a model's modules for the drafted maps (``variants.check.suggest``): what is a linear, a
LayerNorm, a layer list, an attention (four D×D linears, a fused projection, an
``nn.MultiheadAttention``, or per-head layers), by module types, shapes, names and registration
order alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import Tensor, nn

from common.config import TransformerConfig
from common.probes import Probe

PROJECTIONS = ("wq", "wk", "wv", "wo")
GAIN_NAMES = ("weight", "gamma", "a_2", "alpha", "g", "gain", "scale")
OUT_HINTS = re.compile(r"out|^w_?o$|^fc(_o)?$|^o(_proj)?$|^proj$", re.I)  # an output projection's names
CROSS_HINTS = re.compile(r"src|enc|cross|mem|context|inter", re.I)


def weight_of(module: nn.Module) -> Tensor | None:
    """A module's ``weight`` where it has one as a tensor (a user may have deleted or replaced it)."""
    weight = getattr(module, "weight", None)
    return weight if isinstance(weight, Tensor) else None


def linear_shape(module: nn.Module) -> tuple[int, ...] | None:
    """An ``nn.Linear``'s (out, in), None for anything else or a linear without its weight."""
    weight = weight_of(module) if isinstance(module, nn.Linear) else None
    return tuple(weight.shape) if weight is not None and weight.ndim == 2 else None


def has_bias(module: nn.Module) -> bool:
    return isinstance(getattr(module, "bias", None), Tensor)


def norm_like(module: nn.Module, width: int) -> bool:
    if isinstance(module, nn.LayerNorm):
        return True
    own = list(module.named_parameters(recurse=False))
    return (not any(True for _ in module.children()) and len(own) == 2
            and all(p.ndim == 1 and p.shape[0] == width for _, p in own))


def norm_params(name: str, module: nn.Module) -> tuple[str, str | None]:
    own = [n for n, _ in module.named_parameters(recurse=False)]
    if not own:
        return "", None
    gain = next((n for n in own if n in GAIN_NAMES), own[0])
    shift = next((n for n in own if n != gain), None)
    prefix = f"{name}." if name else ""
    return prefix + gain, (prefix + shift) if shift else None


def _owner(path: str, modules: dict[str, nn.Module]) -> str:
    """The module a linear belongs to: its parent, or the parent's parent for a ModuleList."""
    parent = path.rpartition(".")[0]
    if isinstance(modules.get(parent), (nn.ModuleList, nn.Sequential, nn.ModuleDict)):
        parent = parent.rpartition(".")[0]
    return parent


def under(path: str, prefix: str) -> bool:
    return path.startswith(prefix + ".")


def layer_lists(model: nn.Module, config: TransformerConfig) -> dict[str, str]:
    """stack -> the path of the list holding its layers (encoder: one attention per layer)."""
    modules = dict(model.named_modules())
    found: dict[str, str] = {}
    for path, module in modules.items():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)) or len(module) != config.n_layers:
            continue
        counts = {len(attentions(f"{path}.{k}" if path else str(k), modules, config.d_model, config.n_heads))
                  for k in range(config.n_layers)}
        if counts == {1}:
            found.setdefault("encoder", path)
        elif counts == {2}:
            found.setdefault("decoder", path)
    return found


@dataclass(frozen=True)
class Attention:
    """One attention found in a layer: where W_q, W_k, W_v, W_o live, and where to probe it."""

    owner: str
    slots: tuple[tuple[str, str | None, tuple[int, int] | None], ...]  # (weight, bias, chunk) per projection
    probe: Probe
    linears: tuple[str, ...]  # the modules it uses, so the feed-forward search skips them


def _linear_slot(path: str, modules: dict[str, nn.Module],
                 chunk=None) -> tuple[str, str | None, tuple | None]:
    return f"{path}.weight", f"{path}.bias" if has_bias(modules[path]) else None, chunk


QKV_WORDS = {"q": {"q", "query", "queries", "wq", "qs"}, "k": {"k", "key", "keys", "wk", "ks"},
             "v": {"v", "value", "values", "wv", "vs"}}


def _qkv_role(leaf: str) -> str | None:
    """"q", "k" or "v" where a linear's own name says which projection it is."""
    words = set(re.split(r"[_\d]+", leaf.lower()))
    return next((role for role, known in QKV_WORDS.items() if words & known), None)


def _by_role(paths: list[str], leaf=lambda path: path.rpartition(".")[2]) -> list[str]:
    """Three projections as (query, key, value): by their names where those say, else as given."""
    roles = [_qkv_role(leaf(path)) for path in paths]
    if sorted(map(str, roles)) == ["k", "q", "v"]:
        return [paths[roles.index(role)] for role in "qkv"]
    return paths


def per_head_attentions(layer: str, modules: dict[str, nn.Module], width: int, heads: int) -> list[Attention]:
    """The attentions inside ``layer`` written as per-head layers: a list of ``heads`` modules each
    holding three ``Linear(width, width / heads)`` (query, key, value), or three lists of ``heads``
    such linears, beside one ``Linear(width, width)`` output projection in the same module. Their
    weight slots are templates with ``{h}``, the head."""
    if heads < 2 or width % heads:
        return []
    head_shape = (width // heads, width)
    lists: dict[str, list[str]] = {}  # owner -> its per-head lists
    for path, module in modules.items():
        if not under(path, layer) or not isinstance(module, nn.ModuleList) or len(module) != heads:
            continue
        first = f"{path}.0"
        inner = [p for p, m in modules.items() if (p == first or under(p, first)) and
                 linear_shape(m) == head_shape]
        if inner == [first] or len(inner) == 3:
            lists.setdefault(path.rpartition(".")[0], []).append(path)
    found = []
    for owner, paths in lists.items():
        if len(paths) == 3 and all(isinstance(modules[f"{p}.0"], nn.Linear) for p in paths):
            slots = [f"{p}.{{h}}" for p in _by_role(paths)]  # three lists of H linears
        elif len(paths) == 1:
            first = f"{paths[0]}.0"
            inner = [p for p, m in modules.items() if under(p, first) and linear_shape(m) == head_shape]
            slots = [paths[0] + ".{h}" + p[len(first):] for p in _by_role(inner)]
        else:
            continue
        outs = [p for p, m in modules.items() if under(p, owner) and linear_shape(m) == (width, width)
                and not any(under(p, q) for q in paths)]
        if len(outs) > 1:
            outs = [p for p in outs if OUT_HINTS.search(p.rpartition(".")[2])]
        if len(outs) != 1:
            continue
        bias = has_bias(modules[slots[0].replace("{h}", "0")])
        head_slots = tuple((f"{slot}.weight", f"{slot}.bias" if bias else None, None) for slot in slots)
        used = tuple(p for p in modules if any(under(p, q) or p == q for q in paths))
        found.append(Attention(owner, (*head_slots, _linear_slot(outs[0], modules)), Probe(outs[0]),
                               (*used, outs[0])))
    return found


def attentions(layer: str, modules: dict[str, nn.Module], width: int, heads: int = 1) -> list[Attention]:
    """The attentions inside ``layer``, in registration order: an ``nn.MultiheadAttention``; or a
    module holding four D×D linears (W_q, W_k, W_v, W_o in registration order), a fused
    (3D, D) projection and a D×D output, or a D×D query, a fused (2D, D) key-value projection
    and a D×D output; or per-head layers (``per_head_attentions``)."""
    found: list[Attention] = per_head_attentions(layer, modules, width, heads)
    owners: dict[str, list[str]] = {}
    for path, module in modules.items():
        if not under(path, layer) or any(under(path, a.owner) for a in found):
            continue
        if isinstance(module, nn.MultiheadAttention) and isinstance(module.in_proj_weight, Tensor):
            bias = f"{path}.in_proj_bias" if module.in_proj_bias is not None else None
            slots = tuple((f"{path}.in_proj_weight", bias, (k, 3)) for k in range(3))
            found.append(Attention(path, (*slots, _linear_slot(f"{path}.out_proj", modules)),
                                   Probe(path, item=0), (f"{path}.out_proj",)))
        elif (shape := linear_shape(module)) is not None and shape[1] == width and \
                shape[0] in (width, 2 * width, 3 * width):
            owners.setdefault(_owner(path, modules), []).append(path)
    for owner, linears in owners.items():
        rows = sorted(linear_shape(modules[path])[0] // width for path in linears)
        square = [path for path in linears if linear_shape(modules[path])[0] == width]
        outs = [path for path in square if OUT_HINTS.search(path.rpartition(".")[2])]
        if len(outs) == 1:  # named as the output projection: last, whatever its registration
            square = [path for path in square if path != outs[0]] + outs
        if len(square) == 4:  # named q, k, v: by name
            square = _by_role(square[:3]) + square[3:]
        fused = next((path for path in linears if linear_shape(modules[path])[0] > width), None)
        if rows == [1, 1, 1, 1]:
            slots = tuple(_linear_slot(path, modules) for path in square)
        elif rows == [1, 3]:
            slots = (*(_linear_slot(fused, modules, (k, 3)) for k in range(3)),
                     _linear_slot(square[0], modules))
        elif rows == [1, 1, 2]:
            slots = (_linear_slot(square[0], modules),
                     *(_linear_slot(fused, modules, (k, 2)) for k in range(2)),
                     _linear_slot(square[1], modules))
        else:
            continue
        found.append(Attention(owner, slots, Probe(square[-1]), tuple(linears)))
    return sorted(found, key=lambda a: list(modules).index(a.owner))

