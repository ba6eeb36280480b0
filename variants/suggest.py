"""Draft a class's ``weight_map`` and ``probe_map`` from its modules: ``python -m variants.check
SPEC --suggest-maps`` prints them as Python to paste, and a class that declares neither gets them
inferred when it is built (``variants.outside``).

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

from common.batches import random_batch
from common.config import TransformerConfig
from common.probes import Probe, probe_points
from common.weights import canonical_shapes

PROJECTIONS = ("wq", "wk", "wv", "wo")
GAIN_NAMES = ("weight", "gamma", "a_2", "alpha", "g", "gain", "scale")
CROSS_HINTS = re.compile(r"src|enc|cross|mem|context|inter", re.I)


@dataclass
class Draft:
    """Concrete maps (canonical name or point -> the model's name) and what could not be placed."""

    weights: dict[str, str | None] = field(default_factory=dict)
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


def attentions(layer: str, modules: dict[str, nn.Module], width: int) -> list[tuple[str, list[str]]]:
    """(owner, its four D×D linears in registration order) for each attention inside ``layer``."""
    owners: dict[str, list[str]] = {}
    for path, module in modules.items():
        if _under(path, layer) and isinstance(module, nn.Linear) and module.weight.shape == (width, width):
            owners.setdefault(_owner(path, modules), []).append(path)
    return [(owner, linears) for owner, linears in owners.items() if len(linears) == 4]


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
            if len(found) == 2 and CROSS_HINTS.search(found[0][0].rpartition(".")[2]) \
                    and not CROSS_HINTS.search(found[1][0].rpartition(".")[2]):
                found.reverse()
            for canonical, (_, linears) in zip(names, found, strict=False):
                for proj, linear in zip(PROJECTIONS, linears, strict=True):
                    out.weights[f"{prefix}.{canonical}.{proj}.weight"] = f"{linear}.weight"
                    out.weights[f"{prefix}.{canonical}.{proj}.bias"] = \
                        f"{linear}.bias" if modules[linear].bias is not None else None
                out.probes[f"{prefix}.{canonical}"] = Probe(linears[3])
            for w, (d_in, d_out) in (("w1", (width, config.d_ff)), ("w2", (config.d_ff, width))):
                fits = [p for p, m in modules.items() if _under(p, layer) and isinstance(m, nn.Linear)
                        and m.weight.shape == (d_out, d_in)]
                if d_in == d_out:
                    used = {lin for _, lins in found for lin in lins}
                    fits = [p for p in fits if p not in used][w == "w2":][:1]
                if len(fits) == 1:
                    out.weights[f"{prefix}.ff.{w}.weight"] = f"{fits[0]}.weight"
                    out.weights[f"{prefix}.ff.{w}.bias"] = f"{fits[0]}.bias" if modules[fits[0]].bias \
                        is not None else None
                    if w == "w2":
                        out.probes[f"{prefix}.ff"] = Probe(fits[0])
            if i == 0 and f"{prefix}.ff.w1.weight" not in out.weights:
                widths = {m.weight.shape[0] for p, m in modules.items() if _under(p, layer)
                          and isinstance(m, nn.Linear) and m.weight.shape[1] == width and m.weight.shape[0] != width}
                if len(widths) == 1 and not any("feed-forward is" in note for note in out.notes):
                    wide = widths.pop()
                    out.notes.append(f"the feed-forward is {wide} wide ({layer}), the config's d_ff "
                                     f"{config.d_ff}: pass --d-ff {wide}")
            norms = [p for p, m in modules.items() if _under(p, layer) and _norm_like(m, width)]
            if len(norms) == expected:
                for n, norm in enumerate(norms, start=1):
                    gain, shift = _norm_params(norm, modules[norm])
                    out.weights[f"{prefix}.norm{n}.weight"], out.weights[f"{prefix}.norm{n}.bias"] = gain, shift
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
    placed = {target for target in out.weights.values() if target}
    first_name = {id(p): n for n, p in params.items()}
    placed = {first_name.get(id(dict(model.named_parameters(remove_duplicate=False)).get(t)), t) for t in placed}
    out.unplaced = [name for name in params if name not in placed]
    return out


# --- writing the draft as patterns ------------------------------------------------------------


def _generalise(entries: dict[str, str | None], layers: dict[tuple[str, int], str]) -> dict[str, str | None]:
    """Concrete entries -> patterns with {i}, {stack} and {kind} where every instance agrees."""

    def layer_template(stack: str) -> str | None:
        paths = [layers[(stack, i)] for i in range(len({k for s, k in layers if s == stack}))]
        template = paths[0].rpartition(".")[0] + ".{i}" if "." in paths[0] else "{i}"
        return template if all(template.format(i=i) == p for i, p in enumerate(paths)) else None

    step: dict[str, str | None] = {}
    for name, target in entries.items():
        match = re.fullmatch(r"(encoder|decoder)\.layers\.(\d+)(\..+)?", name)
        template = layer_template(match.group(1)) if match else None
        if match and template is not None:
            layer = layers[(match.group(1), int(match.group(2)))]
            if target is None or target == layer or target.startswith(layer + "."):
                rest = None if target is None else template + target[len(layer):]
                step[f"{match.group(1)}.layers.{{i}}{match.group(3) or ''}"] = rest
                continue
        step[name] = target
    merged: dict[str, str | None] = {}
    for name, target in step.items():
        stack = name.partition(".")[0]
        other = {"encoder": "decoder", "decoder": "encoder"}.get(stack)
        twin = None if other is None else other + name[len(stack):]
        if other is not None and twin in step:
            mine = None if target is None else target.replace(stack, "{stack}")
            theirs = None if step[twin] is None else step[twin].replace(other, "{stack}")
            if mine == theirs and (target is None or target.count(stack) >= 1):
                merged["{stack}" + name[len(stack):]] = mine
                continue
        merged[name] = target
    kinds: dict[str, str | None] = {}
    for name, target in merged.items():
        base, _, kind = name.rpartition(".")
        weight, bias = merged.get(f"{base}.weight", "-"), merged.get(f"{base}.bias", "-")
        same = (weight is None and bias is None) or (
            isinstance(weight, str) and isinstance(bias, str) and weight.endswith(".weight")
            and bias == weight[: -len("weight")] + "bias")
        if kind in ("weight", "bias") and same:
            kinds[f"{base}.{{kind}}"] = None if weight is None else weight[: -len("weight")] + "{kind}"
        else:
            kinds[name] = target
    return kinds


def weight_patterns(found: Draft) -> dict[str, str | None]:
    return _generalise(found.weights, found.layers)


def probe_patterns(found: Draft) -> dict[str, Probe | str | None]:
    plain = {point: (None if probe is None else probe.module if probe.call == 0 else probe)
             for point, probe in found.probes.items()}
    strings = {point: target for point, target in plain.items() if not isinstance(target, Probe)}
    patterns: dict[str, Probe | str | None] = dict(_generalise(strings, found.layers))
    patterns.update({point: target for point, target in plain.items() if isinstance(target, Probe)})
    return patterns


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
    if found.unplaced:
        lines.append(f"# parameters with no canonical name (learned positions, an extra norm?): list them in "
                     f"extra_parameters, or map them")
        lines.append(f"extra_parameters = {tuple(found.unplaced)!r}")
    lines.append("weight_map = {")
    lines += [f"    {key!r}: {value!r}," for key, value in weight_patterns(found).items()]
    lines.append("}")
    lines.append("probe_map = {  # from common.probes import Probe, where a Probe(...) appears")
    lines += [f"    {key!r}: {value!r}," for key, value in probe_patterns(found).items()]
    lines.append("}")
    return "\n".join(lines)
