"""Draft a class's ``weight_map`` and ``probe_map`` from its modules: ``python -m variants.check
SPEC --suggest-maps`` prints them as Python to paste, and a class that declares neither gets them
inferred when it is built (``variants.check.outside``).

What is read, and nothing else: module types and shapes (``nn.Embedding``, ``nn.Linear``, a
LayerNorm: ``nn.LayerNorm`` or a module holding two 1-D tensors of width d_model), registration
order, and one forward pass in eval mode (which module's output is each stack's first input).
The layers are the ``n_layers`` elements of a ``ModuleList``/``Sequential``; a layer holding one
attention is the encoder's, two the decoder's. An attention is four ``Linear(d_model, d_model)``
under one module, taken as W_q, W_k, W_v, W_o in registration order (the order every common
tutorial registers them in); the feed-forward is the ``Linear(d_model, d_ff)`` and
``Linear(d_ff, d_model)`` of a layer; the layer's LayerNorms are norm1, norm2 (, norm3) in
registration order; a LayerNorm in the stack's module outside its layers is the final norm
(none: declared absent). Each point is probed where its canonical value is computed: an
attention at its W_o, the feed-forward at its second linear, a norm at its module, so a
sublayer that returns ``norm(x + dropout(W_o ...))`` is still probed right. The embedding points
are the first layer's input. What cannot be placed is listed, not guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from common.config import TransformerConfig
from common.probes import Probe, probe_points
from common.random_batch import random_batch
from common.weights import Param, canonical_shapes

PROJECTIONS = ("wq", "wk", "wv", "wo")
GAIN_NAMES = ("weight", "gamma", "a_2", "alpha", "g", "gain", "scale")
OUT_HINTS = re.compile(r"out|^w_?o$|^fc(_o)?$|^o(_proj)?$|^proj$", re.I)  # an output projection's names
CROSS_HINTS = re.compile(r"src|enc|cross|mem|context|inter", re.I)


@dataclass
class Draft:
    """Concrete maps (canonical name or point -> the model's name) and what could not be placed."""

    weights: dict[str, str | Param | None] = field(default_factory=dict)
    probes: dict[str, Probe | None] = field(default_factory=dict)
    unplaced: list[str] = field(default_factory=list)  # the model's parameters no canonical name took
    notes: list[str] = field(default_factory=list)  # why a point or a weight is missing
    layers: dict[tuple[str, int], str] = field(default_factory=dict)  # (stack, i) -> the layer's module


def _norm_like(module: nn.Module, width: int) -> bool:
    if isinstance(module, nn.LayerNorm):
        return True
    own = list(module.named_parameters(recurse=False))
    return (not any(True for _ in module.children()) and len(own) == 2
            and all(p.ndim == 1 and p.shape[0] == width for _, p in own))


def _norm_params(name: str, module: nn.Module) -> tuple[str, str | None]:
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


def _under(path: str, prefix: str) -> bool:
    return path.startswith(prefix + ".")


def layer_lists(model: nn.Module, config: TransformerConfig) -> dict[str, str]:
    """stack -> the path of the list holding its layers (encoder: one attention per layer)."""
    modules = dict(model.named_modules())
    found: dict[str, str] = {}
    for path, module in modules.items():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)) or len(module) != config.n_layers:
            continue
        counts = {len(attentions(f"{path}.{k}" if path else str(k), modules, config.d_model))
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
    return f"{path}.weight", f"{path}.bias" if modules[path].bias is not None else None, chunk


QKV_WORDS = {"q": {"q", "query", "queries", "wq", "qs"}, "k": {"k", "key", "keys", "wk", "ks"},
             "v": {"v", "value", "values", "wv", "vs"}}


def _qkv_role(leaf: str) -> str | None:
    """"q", "k" or "v" where a linear's own name says which projection it is."""
    words = set(re.split(r"[_\d]+", leaf.lower()))
    return next((role for role, known in QKV_WORDS.items() if words & known), None)


def attentions(layer: str, modules: dict[str, nn.Module], width: int) -> list[Attention]:
    """The attentions inside ``layer``, in registration order: an ``nn.MultiheadAttention``; or a
    module holding four D×D linears (W_q, W_k, W_v, W_o in registration order), a fused
    (3D, D) projection and a D×D output, or a D×D query, a fused (2D, D) key-value projection
    and a D×D output."""
    found: list[Attention] = []
    owners: dict[str, list[str]] = {}
    for path, module in modules.items():
        if not _under(path, layer) or any(_under(path, a.owner) for a in found):
            continue
        if isinstance(module, nn.MultiheadAttention) and module.in_proj_weight is not None:
            bias = f"{path}.in_proj_bias" if module.in_proj_bias is not None else None
            slots = tuple((f"{path}.in_proj_weight", bias, (k, 3)) for k in range(3))
            found.append(Attention(path, (*slots, _linear_slot(f"{path}.out_proj", modules)),
                                   Probe(path, item=0), (f"{path}.out_proj",)))
        elif isinstance(module, nn.Linear) and module.weight.shape[1] == width and \
                module.weight.shape[0] in (width, 2 * width, 3 * width):
            owners.setdefault(_owner(path, modules), []).append(path)
    for owner, linears in owners.items():
        rows = sorted(modules[path].weight.shape[0] // width for path in linears)
        square = [path for path in linears if modules[path].weight.shape[0] == width]
        outs = [path for path in square if OUT_HINTS.search(path.rpartition(".")[2])]
        if len(outs) == 1:  # named as the output projection: last, whatever its registration
            square = [path for path in square if path != outs[0]] + outs
        roles = [_qkv_role(path.rpartition(".")[2]) for path in square[:3]]
        if len(square) == 4 and sorted(map(str, roles)) == ["k", "q", "v"]:  # named q, k, v: by name
            square = [square[roles.index(role)] for role in "qkv"] + square[3:]
        fused = next((path for path in linears if modules[path].weight.shape[0] > width), None)
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


def trace(model: nn.Module, config: TransformerConfig, firsts: dict[str, str]
          ) -> tuple[dict[str, Probe], list[str]]:
    """One eval forward pass: stack -> the module call whose output is its first layer's input,
    and the modules in the order their calls finished."""
    modules = dict(model.named_modules())
    finished: list[tuple[str, int, Tensor]] = []
    calls: dict[str, int] = {}
    inputs_of: dict[str, Tensor] = {}

    def after(name: str):
        def hook(_module, _args, output) -> None:
            if isinstance(output, Tensor):
                finished.append((name, calls.get(name, 0), output))
            calls[name] = calls.get(name, 0) + 1
        return hook

    def before(stack: str):
        def hook(_module, args) -> None:
            if args and isinstance(args[0], Tensor) and stack not in inputs_of:
                inputs_of[stack] = (args[0], len(finished))
        return hook

    handles = [module.register_forward_hook(after(name)) for name, module in modules.items() if name]
    handles += [modules[first].register_forward_pre_hook(before(stack)) for stack, first in firsts.items()]
    try:
        with torch.no_grad():
            model.eval()(*random_batch(config, 2, 5, 4).inputs())
    finally:
        for handle in handles:
            handle.remove()
    found = {}
    for stack, (tensor, until) in inputs_of.items():
        for name, call, output in reversed(finished[:until]):
            if (output.shape == tensor.shape and output.data_ptr() == tensor.data_ptr()
                    and torch.equal(output, tensor)):
                found[stack] = Probe(name, call)
                break
    return found, [name for name, _, _ in finished]


def draft(model: nn.Module, config: TransformerConfig) -> Draft:
    """The concrete maps for ``model`` (built for ``config``); see the module docstring."""
    out = Draft()
    modules = dict(model.named_modules())
    width = config.d_model
    params = dict(model.named_parameters())
    lists = layer_lists(model, config)
    for stack in ("encoder", "decoder"):
        if stack not in lists:
            out.notes.append(f"no list of {config.n_layers} layers with "
                             f"{'one attention' if stack == 'encoder' else 'two attentions'} each: "
                             f"the {stack}'s layers are not placed")
    firsts = {stack: f"{path}.0" if path else "0" for stack, path in lists.items()}
    try:
        embeds, order = trace(model, config, firsts)
    except Exception as error:  # the model cannot run as the suite calls it: structure alone
        embeds, order = {}, []
        out.notes.append(f"no forward pass ({type(error).__name__}): the embedding points are not placed")
    rank = {name: k for k, name in reversed(list(enumerate(order)))}

    embeddings = [(path, m) for path, m in modules.items() if isinstance(m, nn.Embedding)]
    for canonical, vocab in (("src_embed", config.src_vocab_size), ("tgt_embed", config.tgt_vocab_size)):
        fits = [path for path, m in embeddings if m.weight.shape == (vocab, width)]
        if config.src_vocab_size == config.tgt_vocab_size and len(fits) == 2:
            fits = fits[:1] if canonical == "src_embed" else fits[1:]
        if len(fits) == 1 or (config.share_embeddings and fits):
            out.weights[f"{canonical}.weight"] = f"{fits[0]}.weight"
        out.probes[canonical] = embeds.get("encoder" if canonical == "src_embed" else "decoder")
    generators = [path for path, m in modules.items()
                  if isinstance(m, nn.Linear) and m.weight.shape == (config.tgt_vocab_size, width)]
    if len(generators) == 1:
        out.weights["generator.weight"] = f"{generators[0]}.weight"
        out.weights["generator.bias"] = f"{generators[0]}.bias" if modules[generators[0]].bias is not None \
            else None
    out.probes["generator"] = Probe("")

    for stack, path in lists.items():
        expected = 2 if stack == "encoder" else 3
        container = path.rpartition(".")[0] if "." in path else ""
        for i in range(config.n_layers):
            layer = f"{path}.{i}" if path else str(i)
            out.layers[(stack, i)] = layer
            prefix = f"{stack}.layers.{i}"
            out.probes[prefix] = Probe(layer)
            found = attentions(layer, modules, width)
            names = ("self_attn",) if stack == "encoder" else ("self_attn", "cross_attn")
            if len(found) == 2 and CROSS_HINTS.search(found[0].owner.rpartition(".")[2]) \
                    and not CROSS_HINTS.search(found[1].owner.rpartition(".")[2]):
                found.reverse()
            for canonical, attention in zip(names, found, strict=False):
                for proj, (weight, bias, chunk) in zip(PROJECTIONS, attention.slots, strict=True):
                    out.weights[f"{prefix}.{canonical}.{proj}.weight"] = \
                        Param(weight, chunk=chunk) if chunk else weight
                    out.weights[f"{prefix}.{canonical}.{proj}.bias"] = \
                        None if bias is None else Param(bias, chunk=chunk) if chunk else bias
                out.probes[f"{prefix}.{canonical}"] = attention.probe
            for w, (d_in, d_out) in (("w1", (width, config.d_ff)), ("w2", (config.d_ff, width))):
                fits = [p for p, m in modules.items() if _under(p, layer) and isinstance(m, nn.Linear)
                        and m.weight.shape == (d_out, d_in)]
                if d_in == d_out:
                    used = {lin for attention in found for lin in attention.linears}
                    fits = [p for p in fits if p not in used][w == "w2":][:1]
                if len(fits) == 1:
                    out.weights[f"{prefix}.ff.{w}.weight"] = f"{fits[0]}.weight"
                    out.weights[f"{prefix}.ff.{w}.bias"] = f"{fits[0]}.bias" if modules[fits[0]].bias \
                        is not None else None
                    if w == "w2":
                        out.probes[f"{prefix}.ff"] = Probe(fits[0])
            if i == 0 and f"{prefix}.ff.w1.weight" not in out.weights:
                widths = {m.weight.shape[0] for p, m in modules.items() if _under(p, layer)
                          and isinstance(m, nn.Linear) and m.weight.shape[1] == width
                          and m.weight.shape[0] != width}
                if len(widths) == 1 and not any("feed-forward is" in note for note in out.notes):
                    wide = widths.pop()
                    out.notes.append(f"the feed-forward is {wide} wide ({layer}), the config's d_ff "
                                     f"{config.d_ff}: pass --d-ff {wide}")
            norms = [p for p, m in modules.items() if _under(p, layer) and _norm_like(m, width)]
            if len(norms) == expected:
                for n, norm in enumerate(norms, start=1):
                    gain, shift = _norm_params(norm, modules[norm])
                    out.weights[f"{prefix}.norm{n}.weight"] = gain
                    out.weights[f"{prefix}.norm{n}.bias"] = shift
                    out.probes[f"{prefix}.norm{n}"] = Probe(norm)
            elif i == 0:
                out.notes.append(f"{layer} holds {len(norms)} LayerNorms where a {stack} layer has "
                                 f"{expected}: its norms are not placed")
        finals = [p for p, m in modules.items() if (not container or _under(p, container))
                  and not _under(p, path) and p != path and _norm_like(m, width)]
        if len(finals) > 1 and rank:
            finals = [max(finals, key=lambda p: rank.get(p, -1))]
        if len(finals) == 1:
            gain, shift = _norm_params(finals[0], modules[finals[0]])
            out.weights[f"{stack}.norm.weight"], out.weights[f"{stack}.norm.bias"] = gain, shift
            out.probes[f"{stack}.norm"] = Probe(finals[0])
        elif not finals and container:
            out.weights[f"{stack}.norm.weight"] = out.weights[f"{stack}.norm.bias"] = None
            out.probes[f"{stack}.norm"] = None
            out.notes.append(f"{container} has no LayerNorm after its layers: {stack}.norm declared absent")
    placed = {target.name if isinstance(target, Param) else target
              for target in out.weights.values() if target}
    first_name = {id(p): n for n, p in params.items()}
    every = dict(model.named_parameters(remove_duplicate=False))
    placed = {first_name.get(id(every.get(t)), t) for t in placed}
    out.unplaced = [name for name in params if name not in placed]
    return out


# --- writing the draft as patterns ------------------------------------------------------------


def _name(target) -> str | None:
    return None if target is None else target if isinstance(target, str) else (
        target.name if isinstance(target, Param) else target.module)


def _renamed(target, name: str):
    if isinstance(target, Param):
        return Param(name, target.layout, target.chunk)
    if isinstance(target, Probe):
        return Probe(name, target.call, target.item)
    return name


def _generalise(entries: dict, layers: dict[tuple[str, int], str]) -> dict:
    """Concrete entries (targets: a name, a Param, a Probe or None) -> patterns with {i},
    {stack} and {kind} where every instance agrees."""

    def layer_template(stack: str) -> str | None:
        paths = [layers[(stack, i)] for i in range(len({k for s, k in layers if s == stack}))]
        template = paths[0].rpartition(".")[0] + ".{i}" if "." in paths[0] else "{i}"
        return template if all(template.format(i=i) == p for i, p in enumerate(paths)) else None

    step: dict = {}
    for name, target in entries.items():
        match = re.fullmatch(r"(encoder|decoder)\.layers\.(\d+)(\..+)?", name)
        template = layer_template(match.group(1)) if match else None
        if match and template is not None:
            layer, path = layers[(match.group(1), int(match.group(2)))], _name(target)
            if path is None or path == layer or path.startswith(layer + "."):
                rest = None if path is None else _renamed(target, template + path[len(layer):])
                step[f"{match.group(1)}.layers.{{i}}{match.group(3) or ''}"] = rest
                continue
        step[name] = target
    merged: dict = {}
    for name, target in step.items():
        stack = name.partition(".")[0]
        other = {"encoder": "decoder", "decoder": "encoder"}.get(stack)
        twin = None if other is None else other + name[len(stack):]
        if other is not None and twin in step:
            mine, theirs = target, step[twin]
            if mine is not None:
                mine = _renamed(mine, _name(mine).replace(stack, "{stack}"))
            if theirs is not None:
                theirs = _renamed(theirs, _name(theirs).replace(other, "{stack}"))
            if mine == theirs and (target is None or stack in _name(target)):
                merged["{stack}" + name[len(stack):]] = mine
                continue
        merged[name] = target
    kinds: dict = {}
    for name, target in merged.items():
        base, _, kind = name.rpartition(".")
        weight, bias = merged.get(f"{base}.weight", "-"), merged.get(f"{base}.bias", "-")
        same = (weight is None and bias is None) or (
            type(weight) is type(bias) and _name(weight) is not None and _name(weight).endswith("weight")
            and bias == _renamed(weight, _name(weight)[: -len("weight")] + "bias"))
        if kind in ("weight", "bias") and same:
            kinds[f"{base}.{{kind}}"] = None if weight is None else \
                _renamed(weight, _name(weight)[: -len("weight")] + "{kind}")
        else:
            kinds[name] = target
    return kinds


def weight_patterns(found: Draft) -> dict:
    return _generalise(found.weights, found.layers)


def probe_patterns(found: Draft) -> dict:
    general = _generalise(found.probes, found.layers)
    return {point: (probe.module if isinstance(probe, Probe) and probe.call == 0 and probe.item is None
                    else probe)
            for point, probe in general.items()}


def complete(found: Draft, config: TransformerConfig) -> list[str]:
    """What the draft leaves out: canonical names and points it could not place."""
    missing = [name for name in canonical_shapes(config) if name not in found.weights]
    points = [point for point in probe_points(config) if point not in found.probes]
    return missing + points


def as_python(found: Draft, config: TransformerConfig, name: str) -> str:
    """The draft as Python to paste into the class ``name``."""
    lines = [f"# drafted by python -m variants.check --suggest-maps for {name}; read it before trusting it"]
    for note in found.notes:
        lines.append(f"# note: {note}")
    missing = complete(found, config)
    if missing:
        lines.append(f"# TODO: not placed: {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
    if found.unplaced and not missing:
        lines.append("# parameters with no canonical name (learned positions, an extra norm?): list them in "
                     "extra_parameters, or map them")
        lines.append(f"extra_parameters = {tuple(found.unplaced)!r}")
    elif found.unplaced:
        lines.append(f"# {len(found.unplaced)} parameters not placed, e.g. {', '.join(found.unplaced[:3])}")
    lines.append("weight_map = {")
    lines += [f"    {key!r}: {value!r}," for key, value in weight_patterns(found).items()]
    lines.append("}")
    lines.append("probe_map = {  # Probe: from common.probes; Param (in weight_map): from common.weights")
    lines += [f"    {key!r}: {value!r}," for key, value in probe_patterns(found).items()]
    lines.append("}")
    return "\n".join(lines)
