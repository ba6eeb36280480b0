"""Draft a class's ``weight_map`` and ``probe_map`` from its modules: ``python -m variants.check
SPEC --suggest-maps`` prints them as Python to paste, and a class that declares neither gets them
inferred when it is built (``variants.check.outside``).

What is read, and nothing else: module types and shapes (``nn.Embedding``, ``nn.Linear``, a
LayerNorm: ``nn.LayerNorm`` or a module holding two 1-D tensors of width d_model), registration
order, and one forward pass in eval mode (which module's output is each stack's first input, the
order modules are called in); tensors are compared NaN-safe, so uninitialised memory reads alike.
The layers are the ``n_layers`` elements of a ``ModuleList``/``Sequential``; a layer holding one
attention is the encoder's, two the decoder's. An attention is four ``Linear(d_model, d_model)``
under one module, taken as W_q, W_k, W_v, W_o in registration order (the order every common tutorial
registers them in), or per-head layers: a list of H modules each holding a query, key and value
``Linear(d_model, d_model / H)`` (or three lists of H such linears) and one ``Linear(d_model,
d_model)`` output, whose weights a ``{h}`` in the target sends to row blocks; the feed-forward is
the ``Linear(d_model, d_ff)`` and ``Linear(d_ff, d_model)`` of a layer (the decoder's
``decoder_ff_dim`` wide); the layer's LayerNorms are norm1, norm2 (, norm3) in the order the forward
pass calls them (a feed-forward may register its own norm first and call it last), in registration
order with a note where the pass did not reach them; the final norm is the LayerNorm (outside every
layer) that takes the last layer's output (none: declared absent). Layer lists named otherwise than
encoder/decoder (``enc_blocks``, ``dec_blocks``) give ``stack_names``, so one pattern serves both
stacks. A module that returns a tuple (a layer's ``(output, attention)``) is probed at its item 0.
Each point is probed where its canonical value is computed: an attention at its W_o, the
feed-forward at its second linear, a norm at its module, so a sublayer that returns ``norm(x +
dropout(W_o ...))`` is still probed right. The embedding points are the first layer's input. What
cannot be placed is listed, not guessed; a module the draft cannot read is passed over, never a
traceback; what the draft could not decide is a note.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from common.cli import error_line
from common.config import TransformerConfig
from common.probes import Probe
from common.random_batch import random_batch
from common.weights import Param
from variants.check.patterns import Draft
from variants.check.reading import (
    CROSS_HINTS,
    PROJECTIONS,
    attentions,
    has_bias,
    layer_lists,
    linear_shape,
    norm_like,
    norm_params,
    under,
    weight_of,
)


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
                if name and norm_like(module, config.d_model)]
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
    """One tensor: the same storage, shape and values (dropout in eval mode returns its input);
    NaN equal to NaN, so a model holding uninitialised memory is read as any other."""
    return (a.shape == b.shape and a.data_ptr() == b.data_ptr()
            and bool(((a == b) | (a.isnan() & b.isnan())).all()))


def called_order(norms: list[str], seen: Trace, layer: str, notes: list[str]) -> list[str]:
    """A layer's LayerNorms in the order the forward pass first called them (norm1 is the first
    one the layer uses, wherever it is registered), with a note where that differs from their
    registration order; in registration order, noted, where the pass did not reach them all."""
    if not norms or not seen.order:
        return norms
    first = {name: k for k, name in reversed(list(enumerate(seen.order)))}
    if not all(norm in first for norm in norms):
        if not any(f"norms of {layer}" in note for note in notes):
            notes.append(f"the norms of {layer} are placed in registration order: the forward pass did not "
                         f"call them all; check norm1, norm2 against the order the layer uses them")
        return norms
    called = sorted(norms, key=first.__getitem__)
    if called != norms and not any("registration order" in note and "call order" in note for note in notes):
        notes.append(f"the norms of {layer} are placed in call order ({', '.join(called)}), not their "
                     f"registration order")
    return called


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
                  and weight_of(m) is not None]
    for canonical, vocab in (("src_embed", config.src_vocab_size), ("tgt_embed", config.tgt_vocab_size)):
        fits = [path for path, m in embeddings if tuple(m.weight.shape) == (vocab, width)]
        if config.src_vocab_size == config.tgt_vocab_size and len(fits) == 2:
            fits = fits[:1] if canonical == "src_embed" else fits[1:]
        if len(fits) == 1 or (config.share_embeddings and fits):
            out.weights[f"{canonical}.weight"] = f"{fits[0]}.weight"
        stack = "encoder" if canonical == "src_embed" else "decoder"
        out.probes[canonical] = seen.embeds.get(stack)
        if out.probes[canonical] is None and stack in lists and seen.shape is not None:
            out.notes.append(f"{canonical}: no module's output is the {stack}'s first input (computed in "
                             f"forward itself?): probe it by hand, or leave it None")
    generators = [path for path, m in modules.items() if linear_shape(m) == (config.tgt_vocab_size, width)]
    if len(generators) == 1:
        out.weights["generator.weight"] = f"{generators[0]}.weight"
        out.weights["generator.bias"] = f"{generators[0]}.bias" if has_bias(modules[generators[0]]) else None
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
                fits = [p for p, m in modules.items() if under(p, layer) and p not in used
                        and linear_shape(m) == (d_out, d_in)]
                if d_in == d_out:
                    fits = fits[w == "w2":][:1]
                if len(fits) == 1:
                    out.weights[f"{prefix}.ff.{w}.weight"] = f"{fits[0]}.weight"
                    out.weights[f"{prefix}.ff.{w}.bias"] = f"{fits[0]}.bias" if has_bias(modules[fits[0]]) \
                        else None
                    if w == "w2":
                        out.probes[f"{prefix}.ff"] = Probe(fits[0])
            if i == 0 and f"{prefix}.ff.w1.weight" not in out.weights:
                widths = {shape[0] for p, m in modules.items() if under(p, layer) and p not in used
                          and (shape := linear_shape(m)) is not None and shape[1] == width
                          and shape[0] != width}
                if len(widths) == 1 and not any("feed-forward is" in note for note in out.notes):
                    wide = widths.pop()
                    out.notes.append(f"the feed-forward is {wide} wide ({layer}), the config's "
                                     f"{option[2:].replace('-', '_')} {inner}: pass {option} {wide}")
            norms = called_order([p for p, m in modules.items() if under(p, layer) and norm_like(m, width)],
                                 seen, layer, out.notes)
            if len(norms) == expected_norms:
                for n, norm in enumerate(norms, start=1):
                    gain, shift = norm_params(norm, modules[norm])
                    out.weights[f"{prefix}.norm{n}.weight"] = gain
                    out.weights[f"{prefix}.norm{n}.bias"] = shift
                    out.probes[f"{prefix}.norm{n}"] = Probe(norm)
            elif i == 0:
                out.notes.append(f"{layer} holds {len(norms)} LayerNorms where a {stack} layer has "
                                 f"{expected_norms}: its norms are not placed")
        final = final_norm(stack, path, container, lists, modules, seen, config)
        if final:
            gain, shift = norm_params(final, modules[final])
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
    candidates = [p for p, m in modules.items() if (not container or under(p, container))
                  and not any(under(p, other) or p == other for other in lists.values())
                  and norm_like(m, config.d_model)]
    last = f"{path}.{config.n_layers - 1}" if path else str(config.n_layers - 1)
    if last in seen.outputs:
        fed = [p for p in candidates
               if p in seen.norm_inputs and _same(seen.norm_inputs[p], seen.outputs[last])]
        if fed:
            return fed[0] if len(fed) == 1 else False
    if container and len(candidates) <= 1:  # the stack's own module: its one norm, or none
        return candidates[0] if candidates else None
    return None if last in seen.outputs else False

