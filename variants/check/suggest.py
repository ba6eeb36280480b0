"""Draft a class's ``weight_map`` and ``probe_map`` from its modules: ``python -m variants.check
SPEC --suggest-maps`` prints them as Python to paste, and a class that declares neither gets them
inferred when it is built (``variants.check.outside``).

What is read, and nothing else: module types and shapes (``nn.Embedding``, ``nn.Linear``, a
LayerNorm: ``nn.LayerNorm`` or a module holding two 1-D tensors of width d_model), registration
order, and one forward pass in eval mode (which module's output is each stack's first input).
The layers are the ``n_layers`` elements of a ``ModuleList``/``Sequential``; a layer holding one
attention is the encoder's, two the decoder's. An attention is four ``Linear(d_model, d_model)``
under one module, taken as W_q, W_k, W_v, W_o in registration order (the order every common
tutorial registers them in), or per-head layers: a list of H modules each holding a query, key
and value ``Linear(d_model, d_model / H)`` (or three lists of H such linears) and one
``Linear(d_model, d_model)`` output, whose weights a ``{h}`` in the target sends to row blocks;
the feed-forward is the ``Linear(d_model, d_ff)`` and ``Linear(d_ff, d_model)`` of a layer (the
decoder's ``decoder_ff_dim`` wide); the layer's LayerNorms are norm1, norm2 (, norm3) in
registration order; the final norm is the LayerNorm (outside every layer) that takes the last
layer's output (none: declared absent). Layer lists named otherwise than encoder/decoder
(``enc_blocks``, ``dec_blocks``) give ``stack_names``, so one pattern serves both stacks. A
module that returns a tuple (a layer's ``(output, attention)``) is probed at its item 0. Each
point is probed where its canonical value is computed: an
attention at its W_o, the feed-forward at its second linear, a norm at its module, so a
sublayer that returns ``norm(x + dropout(W_o ...))`` is still probed right. The embedding points
are the first layer's input. What cannot be placed is listed, not guessed; a module the draft
cannot read is passed over, never a traceback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from common.cli import error_line
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
    heads: int = 1  # H, for the {h} of per-head targets


def _weight(module: nn.Module) -> Tensor | None:
    """A module's ``weight`` where it has one as a tensor (a user may have deleted or replaced it)."""
    weight = getattr(module, "weight", None)
    return weight if isinstance(weight, Tensor) else None


def _linear_shape(module: nn.Module) -> tuple[int, ...] | None:
    """An ``nn.Linear``'s (out, in), None for anything else or a linear without its weight."""
    weight = _weight(module) if isinstance(module, nn.Linear) else None
    return tuple(weight.shape) if weight is not None and weight.ndim == 2 else None


def _has_bias(module: nn.Module) -> bool:
    return isinstance(getattr(module, "bias", None), Tensor)


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
    return f"{path}.weight", f"{path}.bias" if _has_bias(modules[path]) else None, chunk


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
        if not _under(path, layer) or not isinstance(module, nn.ModuleList) or len(module) != heads:
            continue
        first = f"{path}.0"
        inner = [p for p, m in modules.items() if (p == first or _under(p, first)) and
                 _linear_shape(m) == head_shape]
        if inner == [first] or len(inner) == 3:
            lists.setdefault(path.rpartition(".")[0], []).append(path)
    found = []
    for owner, paths in lists.items():
        if len(paths) == 3 and all(isinstance(modules[f"{p}.0"], nn.Linear) for p in paths):
            slots = [f"{p}.{{h}}" for p in _by_role(paths)]  # three lists of H linears
        elif len(paths) == 1:
            first = f"{paths[0]}.0"
            inner = [p for p, m in modules.items() if _under(p, first) and _linear_shape(m) == head_shape]
            slots = [paths[0] + ".{h}" + p[len(first):] for p in _by_role(inner)]
        else:
            continue
        outs = [p for p, m in modules.items() if _under(p, owner) and _linear_shape(m) == (width, width)
                and not any(_under(p, q) for q in paths)]
        if len(outs) > 1:
            outs = [p for p in outs if OUT_HINTS.search(p.rpartition(".")[2])]
        if len(outs) != 1:
            continue
        bias = _has_bias(modules[slots[0].replace("{h}", "0")])
        head_slots = tuple((f"{slot}.weight", f"{slot}.bias" if bias else None, None) for slot in slots)
        used = tuple(p for p in modules if any(_under(p, q) or p == q for q in paths))
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
        if not _under(path, layer) or any(_under(path, a.owner) for a in found):
            continue
        if isinstance(module, nn.MultiheadAttention) and isinstance(module.in_proj_weight, Tensor):
            bias = f"{path}.in_proj_bias" if module.in_proj_bias is not None else None
            slots = tuple((f"{path}.in_proj_weight", bias, (k, 3)) for k in range(3))
            found.append(Attention(path, (*slots, _linear_slot(f"{path}.out_proj", modules)),
                                   Probe(path, item=0), (f"{path}.out_proj",)))
        elif (shape := _linear_shape(module)) is not None and shape[1] == width and \
                shape[0] in (width, 2 * width, 3 * width):
            owners.setdefault(_owner(path, modules), []).append(path)
    for owner, linears in owners.items():
        rows = sorted(_linear_shape(modules[path])[0] // width for path in linears)
        square = [path for path in linears if _linear_shape(modules[path])[0] == width]
        outs = [path for path in square if OUT_HINTS.search(path.rpartition(".")[2])]
        if len(outs) == 1:  # named as the output projection: last, whatever its registration
            square = [path for path in square if path != outs[0]] + outs
        if len(square) == 4:  # named q, k, v: by name
            square = _by_role(square[:3]) + square[3:]
        fused = next((path for path in linears if _linear_shape(modules[path])[0] > width), None)
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


@dataclass
class Trace:
    """What one eval forward pass shows: each stack's first-layer input (the module call whose
    output it is), the modules in the order their calls finished, the modules that return a
    tuple, each LayerNorm's first input, and the model's output shape."""

    embeds: dict[str, Probe] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    tuples: set[str] = field(default_factory=set)
    norm_inputs: dict[str, Tensor] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)  # each module's first output (item 0 of a tuple)
    shape: tuple[int, ...] | None = None


def trace(model: nn.Module, config: TransformerConfig, firsts: dict[str, str], batch=(2, 5, 4)) -> Trace:
    """One eval forward pass of ``model`` on a batch of ``batch`` (B, S, T) (see ``Trace``)."""
    modules = dict(model.named_modules())
    finished: list[tuple[str, int, Tensor]] = []
    calls: dict[str, int] = {}
    inputs_of: dict[str, tuple[Tensor, int]] = {}
    seen = Trace()

    def after(name: str):
        def hook(_module, _args, output) -> None:
            if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
                seen.tuples.add(name)
                output = output[0]
            if isinstance(output, Tensor):
                finished.append((name, calls.get(name, 0), output))
                seen.outputs.setdefault(name, output)
            calls[name] = calls.get(name, 0) + 1
        return hook

    def before(stack: str):
        def hook(_module, args) -> None:
            if args and isinstance(args[0], Tensor) and stack not in inputs_of:
                inputs_of[stack] = (args[0], len(finished))
        return hook

    def norm_input(name: str):
        def hook(_module, args) -> None:
            if args and isinstance(args[0], Tensor):
                seen.norm_inputs.setdefault(name, args[0])
        return hook

    handles = [module.register_forward_hook(after(name)) for name, module in modules.items() if name]
    handles += [modules[first].register_forward_pre_hook(before(stack)) for stack, first in firsts.items()]
    handles += [module.register_forward_pre_hook(norm_input(name)) for name, module in modules.items()
                if name and _norm_like(module, config.d_model)]
    try:
        with torch.no_grad():
            output = model.eval()(*random_batch(config, *batch).inputs())
    finally:
        for handle in handles:
            handle.remove()
    if isinstance(output, Tensor):
        seen.shape = tuple(output.shape)
    for stack, (tensor, until) in inputs_of.items():
        for name, call, output in reversed(finished[:until]):
            if _same(output, tensor):
                seen.embeds[stack] = Probe(name, call)
                break
    seen.order = [name for name, _, _ in finished]
    return seen


def _same(a: Tensor, b: Tensor) -> bool:
    """One tensor: the same storage, shape and values (dropout in eval mode returns its input)."""
    return a.shape == b.shape and a.data_ptr() == b.data_ptr() and bool(torch.equal(a, b))


def draft(model: nn.Module, config: TransformerConfig) -> Draft:
    """The concrete maps for ``model`` (built for ``config``); see the module docstring."""
    out = Draft(heads=config.n_heads)
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
        seen = trace(model, config, firsts)
    except Exception as error:  # the model cannot run as the suite calls it: structure alone
        seen = Trace()
        out.notes.append(f"no forward pass ({error_line(error)}): the embedding points are not placed")
    expected = (2, 4, config.tgt_vocab_size)
    if seen.shape is not None and seen.shape != expected:
        broadcast = len(seen.shape) == 4 and seen.shape[:1] + seen.shape[2:] == expected
        out.notes.append(f"the forward pass returned {seen.shape}, not (B, T, V) = {expected}"
                         + (": the extra axis is a mask broadcast against tensors of another rank (the suite "
                            "passes src_mask (B, 1, 1, S) and tgt_mask (B, 1, T, T))" if broadcast else ""))

    embeddings = [(path, m) for path, m in modules.items() if isinstance(m, nn.Embedding)
                  and _weight(m) is not None]
    for canonical, vocab in (("src_embed", config.src_vocab_size), ("tgt_embed", config.tgt_vocab_size)):
        fits = [path for path, m in embeddings if tuple(m.weight.shape) == (vocab, width)]
        if config.src_vocab_size == config.tgt_vocab_size and len(fits) == 2:
            fits = fits[:1] if canonical == "src_embed" else fits[1:]
        if len(fits) == 1 or (config.share_embeddings and fits):
            out.weights[f"{canonical}.weight"] = f"{fits[0]}.weight"
        out.probes[canonical] = seen.embeds.get("encoder" if canonical == "src_embed" else "decoder")
    generators = [path for path, m in modules.items() if _linear_shape(m) == (config.tgt_vocab_size, width)]
    if len(generators) == 1:
        out.weights["generator.weight"] = f"{generators[0]}.weight"
        out.weights["generator.bias"] = f"{generators[0]}.bias" if _has_bias(modules[generators[0]]) else None
    out.probes["generator"] = Probe("")

    for stack, path in lists.items():
        expected_norms = 2 if stack == "encoder" else 3
        container = path.rpartition(".")[0] if "." in path else ""
        for i in range(config.n_layers):
            layer = f"{path}.{i}" if path else str(i)
            out.layers[(stack, i)] = layer
            prefix = f"{stack}.layers.{i}"
            out.probes[prefix] = Probe(layer, item=0) if layer in seen.tuples else Probe(layer)
            found = attentions(layer, modules, width, config.n_heads)
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
            used = {lin for attention in found for lin in attention.linears}
            inner, option = (config.d_ff, "--d-ff") if stack == "encoder" else (config.decoder_ff_dim,
                                                                               "--decoder-d-ff")
            for w, (d_in, d_out) in (("w1", (width, inner)), ("w2", (inner, width))):
                fits = [p for p, m in modules.items() if _under(p, layer) and p not in used
                        and _linear_shape(m) == (d_out, d_in)]
                if d_in == d_out:
                    fits = fits[w == "w2":][:1]
                if len(fits) == 1:
                    out.weights[f"{prefix}.ff.{w}.weight"] = f"{fits[0]}.weight"
                    out.weights[f"{prefix}.ff.{w}.bias"] = f"{fits[0]}.bias" if _has_bias(modules[fits[0]]) \
                        else None
                    if w == "w2":
                        out.probes[f"{prefix}.ff"] = Probe(fits[0])
            if i == 0 and f"{prefix}.ff.w1.weight" not in out.weights:
                widths = {shape[0] for p, m in modules.items() if _under(p, layer) and p not in used
                          and (shape := _linear_shape(m)) is not None and shape[1] == width
                          and shape[0] != width}
                if len(widths) == 1 and not any("feed-forward is" in note for note in out.notes):
                    wide = widths.pop()
                    out.notes.append(f"the feed-forward is {wide} wide ({layer}), the config's "
                                     f"{option[2:].replace('-', '_')} {inner}: pass {option} {wide}")
            norms = [p for p, m in modules.items() if _under(p, layer) and _norm_like(m, width)]
            if len(norms) == expected_norms:
                for n, norm in enumerate(norms, start=1):
                    gain, shift = _norm_params(norm, modules[norm])
                    out.weights[f"{prefix}.norm{n}.weight"] = gain
                    out.weights[f"{prefix}.norm{n}.bias"] = shift
                    out.probes[f"{prefix}.norm{n}"] = Probe(norm)
            elif i == 0:
                out.notes.append(f"{layer} holds {len(norms)} LayerNorms where a {stack} layer has "
                                 f"{expected_norms}: its norms are not placed")
        final = final_norm(stack, path, container, lists, modules, seen, config)
        if final:
            gain, shift = _norm_params(final, modules[final])
            out.weights[f"{stack}.norm.weight"], out.weights[f"{stack}.norm.bias"] = gain, shift
            out.probes[f"{stack}.norm"] = Probe(final)
        elif final is None:
            out.weights[f"{stack}.norm.weight"] = out.weights[f"{stack}.norm.bias"] = None
            out.probes[f"{stack}.norm"] = None
            where = container or "the model"
            out.notes.append(f"{where} has no LayerNorm after its {stack} layers: {stack}.norm declared "
                             f"absent")
    placed = set()
    for target in out.weights.values():
        name = target.name if isinstance(target, Param) else target
        if name:
            placed.update({name.format(h=h) for h in range(config.n_heads)} if "{h}" in name else {name})
    first_name = {id(p): n for n, p in params.items()}
    every = dict(model.named_parameters(remove_duplicate=False))
    placed = {first_name.get(id(every.get(t)), t) for t in placed}
    out.unplaced = [name for name in params if name not in placed]
    return out


def final_norm(stack: str, path: str, container: str, lists: dict[str, str], modules: dict[str, nn.Module],
               seen: Trace, config: TransformerConfig) -> str | bool | None:
    """The LayerNorm after ``stack``'s layers (in the list at ``path``): the one, outside every
    layer, whose input is the last layer's output; without a forward pass, the one such norm in the
    stack's module. None: the stack has none (declared absent); False: cannot tell."""
    candidates = [p for p, m in modules.items() if (not container or _under(p, container))
                  and not any(_under(p, other) or p == other for other in lists.values())
                  and _norm_like(m, config.d_model)]
    last = f"{path}.{config.n_layers - 1}" if path else str(config.n_layers - 1)
    if last in seen.outputs:
        fed = [p for p in candidates
               if p in seen.norm_inputs and _same(seen.norm_inputs[p], seen.outputs[last])]
        if fed:
            return fed[0] if len(fed) == 1 else False
    if container and len(candidates) <= 1:  # the stack's own module: its one norm, or none
        return candidates[0] if candidates else None
    return None if last in seen.outputs else False


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


STACKS = ("encoder", "decoder")


def stack_cores(layers: dict[tuple[str, int], str]) -> dict[str, str]:
    """stack -> the word that names it in the model's paths: the one word in which the paths of
    its layer list and the other stack's differ (``enc`` in ``enc_blocks``, ``encoder`` in
    ``encoder.layers``); the canonical names where the paths differ otherwise."""
    if not all((stack, 0) in layers for stack in STACKS):
        return {stack: stack for stack in STACKS}
    words = [re.split(r"([._])", layers[(stack, 0)].rpartition(".")[0]) for stack in STACKS]
    pairs = {(a, b) for a, b in zip(*words, strict=False) if a != b}
    if len(words[0]) != len(words[1]) or len(pairs) != 1:
        return {stack: stack for stack in STACKS}
    return dict(zip(STACKS, pairs.pop(), strict=True))


def own_stack_names(found: Draft) -> dict[str, str]:
    """The ``stack_names`` the draft's patterns use: {} where the model names its stacks encoder
    and decoder."""
    cores = stack_cores(found.layers)
    return {} if cores == {stack: stack for stack in STACKS} else cores


def _with_stack(name: str, core: str) -> str:
    """``name`` with each word ``core`` (a stack's name in the model) written {stack}."""
    return re.sub(rf"(?<![A-Za-z0-9]){re.escape(core)}(?![A-Za-z0-9])", "{stack}", name)


def _generalise(entries: dict, layers: dict[tuple[str, int], str]) -> dict:
    """Concrete entries (targets: a name, a Param, a Probe or None) -> patterns with {i},
    {stack} and {kind} where every instance agrees ({stack} standing for the model's own names of
    its stacks, ``own_stack_names``)."""
    cores = stack_cores(layers)

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
                mine = _renamed(mine, _with_stack(_name(mine), cores[stack]))
            if theirs is not None:
                theirs = _renamed(theirs, _with_stack(_name(theirs), cores[other]))
            if mine == theirs and (target is None or "{stack}" in _name(mine)):
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
    stacks = own_stack_names(found)
    if stacks:
        lines.append(f"stack_names = {stacks!r}  # what {{stack}} stands for in the targets")
    per_head = any("{h}" in (_name(target) or "") for target in found.weights.values())
    lines.append("weight_map = {" + ("  # {h}: each head's layer, holding its rows of the canonical matrix"
                                     if per_head else ""))
    lines += [f"    {key!r}: {value!r}," for key, value in weight_patterns(found).items()]
    lines.append("}")
    lines.append("probe_map = {  # Probe: from common.probes; Param (in weight_map): from common.weights")
    lines += [f"    {key!r}: {value!r}," for key, value in probe_patterns(found).items()]
    lines.append("}")
    return "\n".join(lines)
