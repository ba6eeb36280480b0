"""Probe points: the canonical places in one forward pass where two implementations can be
compared, and the hooks that capture them. The finder that compares two models point by point
and names the first that differs is the checker's (``variants.check.divergence``).

A variant declares ``probe_map`` beside its ``weight_map``: canonical point (a pattern with
``{fields}``, as in ``common.weights``) -> the module whose output is that point::

    probe_map = {
        "src_embed": Probe("dropout", call=0),          # one dropout after both embeddings
        "tgt_embed": Probe("dropout", call=1),
        "{stack}.layers.{i}.self_attn": Probe("transformer.{stack}.layers.{i}.self_attn", item=0),
        "{stack}.layers.{i}.ff": "{stack}.layers.{i}.feed_forward",
        "generator": "",                                # "" = the model itself: its log-probs
        ...
    }

A plain string is ``Probe(name)``; ``None`` says the implementation has no module for that
point (an inline ``F.layer_norm``, say), and the checker's finder passes over it. The map must name every
point, so a forgotten or misspelt one is an error, not a silent gap; an entry for a point the config
leaves out (the final norms under ``final_norm=False``) is passed over.

The points, in order of computation under post-norm (pre-norm puts each norm before its
sublayer, as it computes it), each a (B, L, D) tensor but the generator's (B, T, V):

    src_embed                      E[src] · sqrt(D) + PE, after the embedding dropout: the encoder's input
    encoder.layers.{i}.self_attn   the sublayer's output (after W_o), before its dropout and residual
    encoder.layers.{i}.norm1       the LayerNorm holding norm1's weights: norm1(x + attn) post-norm,
                                   norm1(x), the attention's input, pre-norm
    encoder.layers.{i}.ff          W2 act(W1 x + b1) + b2 (act: config.activation), before its
                                   dropout and residual
    encoder.layers.{i}.norm2       the LayerNorm holding norm2's weights
    encoder.layers.{i}             the layer's output, the next layer's input
    encoder.norm                   the final LayerNorm: the memory, ``encode``'s output (absent
                                   under final_norm=False, as is decoder.norm)
    tgt_embed                      as src_embed, for the target
    decoder.layers.{i}.self_attn, .norm1, .cross_attn, .norm2, .ff, .norm3, decoder.layers.{i}
    decoder.norm                   the final LayerNorm: ``decode``'s output
    generator                      log-probabilities, the model's output
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from common.config import TransformerConfig
from common.weights import first_of_each, match_patterns


@dataclass(frozen=True)
class Probe:
    """Where one point is computed: the output of a module."""

    module: str  # its name in named_modules(), "" for the model itself; may use the point's {fields}
    call: int = 0  # which of its calls in one forward pass, from 0, for a module used more than once
    item: int | None = None  # the element of a tuple output (nn.MultiheadAttention's (output, weights))


def probe_points(config: TransformerConfig) -> list[str]:
    """Every canonical point of a forward pass under ``config``, in the order it is computed (no
    ``encoder.norm``/``decoder.norm`` under ``final_norm=False``)."""

    def layer(prefix: str, sublayers: tuple[str, ...]) -> list[str]:
        steps = []
        for n, sublayer in enumerate(sublayers, start=1):
            norm = f"{prefix}.norm{n}"
            steps += [norm, f"{prefix}.{sublayer}"] if config.norm_first else [f"{prefix}.{sublayer}", norm]
        return [*steps, prefix]

    points = ["src_embed"]
    for i in range(config.n_layers):
        points += layer(f"encoder.layers.{i}", ("self_attn", "ff"))
    points += ["encoder.norm"] * config.final_norm + ["tgt_embed"]
    for i in range(config.n_layers):
        points += layer(f"decoder.layers.{i}", ("self_attn", "cross_attn", "ff"))
    return [*points, *["decoder.norm"] * config.final_norm, "generator"]


def resolve_probes(model: nn.Module) -> dict[str, Probe | None]:
    """point -> the concrete Probe (None where the map declares none), in order of computation.

    Raises LookupError naming every problem of the map at once: a missing map, points it does
    not cover or covers twice, entries that match no point, modules the model lacks.
    """
    cls = type(model)
    if not isinstance(getattr(cls, "probe_map", None), dict):
        raise LookupError(f"{cls.__name__} declares no probe_map (see common/probes.py)")
    points = probe_points(model.config)
    absent = [point for point in probe_points(model.config.replace(final_norm=True)) if point not in points]
    matched, problems = match_patterns(cls.probe_map, points, noun="probe point", absent=absent)
    modules = dict(model.named_modules())
    resolved: dict[str, Probe | None] = {}
    missing = []  # (the entry's module, what is wrong)
    for point, (target, fields) in matched.items():
        probe = Probe(target) if isinstance(target, str) else target
        if probe is not None:
            template, probe = probe.module, Probe(probe.module.format(**fields), probe.call, probe.item)
            if probe.module not in modules:
                missing.append((template, f"sends {point} to {probe.module!r}, which the model lacks"))
        resolved[point] = probe
    problems += first_of_each(missing)
    if problems:
        raise LookupError(f"{cls.__name__}.probe_map " + "; ".join(problems))
    return {point: resolved[point] for point in probe_points(model.config)}


def capture(model: nn.Module, inputs: tuple[Tensor | None, ...],
            stand_ins: dict[str, Probe] | None = None, during: AbstractContextManager | None = None,
            on_point: Callable[[str], None] | None = None, notes: dict[str, str] | None = None,
            ) -> dict[str, Tensor]:
    """The probe points of one forward pass ``model(*inputs)`` (no grad), in the order computed;
    ``stand_ins`` probe points the map declares None where the caller knows a module to read.
    ``during`` (a context manager, such as a dispatch mode watching the operations) is entered
    around the forward pass, and ``on_point`` called with each point's name as it is captured.

    A probe without ``item`` on a module that returns a tuple (a layer's ``(output, attention)``)
    reads the tuple's first element; an output that holds no tensor there is not captured. Each
    such reading is said in ``notes`` (point -> what was read), when given.

    A declared point whose module did not run is absent. ``nn.MultiheadAttention``'s fast path
    can compute whole layers in one kernel without calling their submodules (recent releases
    leave it when hooks are attached; this does not rely on that), so it is off here and
    restored after.
    """
    by_module: dict[str, list[tuple[str, Probe]]] = defaultdict(list)
    resolved = resolve_probes(model)
    for point, probe in resolved.items():
        probe = probe if probe is not None else (stand_ins or {}).get(point)
        if probe is not None:
            by_module[probe.module].append((point, probe))
    modules = dict(model.named_modules())
    captured: dict[str, Tensor] = {}

    def recorder(name: str):
        calls = 0

        def record(_module, _inputs, output) -> None:
            nonlocal calls
            for point, probe in by_module[name]:
                if probe.call == calls:
                    value = output if probe.item is None else output[probe.item]
                    if probe.item is None and isinstance(value, (tuple, list)) and value:
                        value = value[0]
                        if notes is not None:
                            notes[point] = (f"{name or 'the model'} returns a {type(output).__name__}: "
                                            f"its item 0")
                    if not isinstance(value, Tensor):
                        if notes is not None:
                            notes[point] = (f"{name or 'the model'} returns a {type(value).__name__}, "
                                            f"not a tensor")
                        continue
                    captured[point] = value.detach().clone()
                    if on_point is not None:
                        on_point(point)
            calls += 1
        return record

    handles = [modules[name].register_forward_hook(recorder(name)) for name in by_module]
    fast_path = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad(), during if during is not None else nullcontext():
            model(*inputs)
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)
        for handle in handles:
            handle.remove()
    return captured
