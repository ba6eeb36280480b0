"""Probe points: the canonical places in one forward pass where two implementations can be
compared, the hooks that capture them, and the finder that names the first one that differs.

The finder separates precision from structure: measured against the reference's own float32
rounding at each point (the reference run in float32 against itself in float64), a float64
difference within a few times that is float32 rounding (a float32 table, say), noted but not
named as the divergence; the first point past it is.

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
point (an inline ``F.layer_norm``, say), and the finder passes over it. The map must name every
point, so a forgotten or misspelt one is an error, not a silent gap.

The points, in order of computation under post-norm (pre-norm puts each norm before its
sublayer, as it computes it), each a (B, L, D) tensor but the generator's (B, T, V):

    src_embed                      E[src] · sqrt(D) + PE, after the embedding dropout: the encoder's input
    encoder.layers.{i}.self_attn   the sublayer's output (after W_o), before its dropout and residual
    encoder.layers.{i}.norm1       the LayerNorm holding norm1's weights: norm1(x + attn) post-norm,
                                   norm1(x), the attention's input, pre-norm
    encoder.layers.{i}.ff          W2 relu(W1 x + b1) + b2, before its dropout and residual
    encoder.layers.{i}.norm2       the LayerNorm holding norm2's weights
    encoder.layers.{i}             the layer's output, the next layer's input
    encoder.norm                   the final LayerNorm: the memory, ``encode``'s output
    tgt_embed                      as src_embed, for the target
    decoder.layers.{i}.self_attn, .norm1, .cross_attn, .norm2, .ff, .norm3, decoder.layers.{i}
    decoder.norm                   the final LayerNorm: ``decode``'s output
    generator                      log-probabilities, the model's output
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from common.config import TransformerConfig
from common.weights import first_of_each, match_patterns


@dataclass(frozen=True)
class Probe:
    """Where one point is computed: the output of a module."""

    module: str  # its name in named_modules(), "" for the model itself; may use the point's {fields}
    call: int = 0  # which of its calls in one forward pass, from 0, for a module used more than once
    item: int | None = None  # the element of a tuple output (nn.MultiheadAttention's (output, weights))


def probe_points(config: TransformerConfig) -> list[str]:
    """Every canonical point of a forward pass under ``config``, in the order it is computed."""

    def layer(prefix: str, sublayers: tuple[str, ...]) -> list[str]:
        steps = []
        for n, sublayer in enumerate(sublayers, start=1):
            norm = f"{prefix}.norm{n}"
            steps += [norm, f"{prefix}.{sublayer}"] if config.norm_first else [f"{prefix}.{sublayer}", norm]
        return [*steps, prefix]

    points = ["src_embed"]
    for i in range(config.n_layers):
        points += layer(f"encoder.layers.{i}", ("self_attn", "ff"))
    points += ["encoder.norm", "tgt_embed"]
    for i in range(config.n_layers):
        points += layer(f"decoder.layers.{i}", ("self_attn", "cross_attn", "ff"))
    return [*points, "decoder.norm", "generator"]


def resolve_probes(model: nn.Module) -> dict[str, Probe | None]:
    """point -> the concrete Probe (None where the map declares none), in order of computation.

    Raises LookupError naming every problem of the map at once: a missing map, points it does
    not cover or covers twice, entries that match no point, modules the model lacks.
    """
    cls = type(model)
    if not isinstance(getattr(cls, "probe_map", None), dict):
        raise LookupError(f"{cls.__name__} declares no probe_map (see common/probes.py)")
    matched, problems = match_patterns(cls.probe_map, probe_points(model.config), noun="probe point")
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


LOW_PRECISION = (torch.float32, torch.float16, torch.bfloat16)


def float32_valued(tensor: Tensor) -> bool:
    """A float64 tensor whose every value is a float32 number and not all are integers: a table
    computed in float32 and cast up (a float64 computation almost never lands on float32 values)."""
    if tensor.dtype != torch.float64 or tensor.numel() == 0:
        return False
    return (bool(torch.equal(tensor.float().double(), tensor))
            and not bool(torch.equal(tensor.round(), tensor)))


class Float32Watch(TorchDispatchMode):
    """Sees every operation of a forward pass and notes whether one so far took or made a tensor
    of lower precision than float64, or read a buffer holding float32 values: the evidence that
    a float64 run carries float32 rounding."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.seen = False
        self.storages = {buffer.untyped_storage().data_ptr() for buffer in model.buffers()
                         if float32_valued(buffer)}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.seen:
            for item in _leaves((args, kwargs, out)):
                if isinstance(item, Tensor) and (item.dtype in LOW_PRECISION or (
                        self.storages and item.untyped_storage().data_ptr() in self.storages)):
                    self.seen = True
                    break
        return out


def _leaves(tree) -> list:
    """The items of nested tuples, lists and dicts."""
    if isinstance(tree, (tuple, list)):
        return [leaf for item in tree for leaf in _leaves(item)]
    if isinstance(tree, dict):
        return [leaf for item in tree.values() for leaf in _leaves(item)]
    return [tree]


def capture(model: nn.Module, inputs: tuple[Tensor | None, ...],
            stand_ins: dict[str, Probe] | None = None) -> dict[str, Tensor]:
    """The probe points of one forward pass ``model(*inputs)`` (no grad), in the order computed;
    ``stand_ins`` probe points the map declares None where the caller knows a module to read.

    A declared point whose module did not run is absent. ``nn.MultiheadAttention``'s fast path
    can compute whole layers in one kernel without calling their submodules (recent releases
    leave it when hooks are attached; this does not rely on that), so it is off here and
    restored after.
    """
    return capture_watched(model, inputs, stand_ins)[0]


def capture_watched(model: nn.Module, inputs: tuple[Tensor | None, ...],
                    stand_ins: dict[str, Probe] | None = None) -> tuple[dict[str, Tensor], set[str]]:
    """``capture``, and the points computed after float32 evidence (``Float32Watch``)."""
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
                    captured[point] = value.detach().clone()
                    if watch.seen:
                        after.add(point)
            calls += 1
        return record

    watch, after = Float32Watch(model), set()
    handles = [modules[name].register_forward_hook(recorder(name)) for name in by_module]
    fast_path = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad(), watch:
            model(*inputs)
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)
        for handle in handles:
            handle.remove()
    return captured, after


# A departure within this many times the reference's own float32 rounding at a point (how far the
# reference computed in float32 lies from itself in float64 there) is precision, not structure.
ROUNDING_FACTOR = 4.0


@dataclass(frozen=True)
class PointDifference:
    """How far two implementations are apart at one point."""

    point: str
    max_abs: float | None  # largest |a - b|; inf where they cannot be compared; None: not compared
    note: str = ""  # why max_abs is inf or None
    rounding: float | None = None  # the reference's own float32 rounding here, when measured
    float32_seen: bool | None = None  # float32 on the path to here (Float32Watch); None: not watched

    def diverges(self, tolerance: float) -> bool:
        """Past ``tolerance`` and past what float32 rounding explains: a difference of structure."""
        return self.departs(tolerance) and not self.within_rounding()

    def departs(self, tolerance: float) -> bool:
        """Past ``tolerance`` at all (NaN too), whatever the cause."""
        return self.max_abs is not None and not self.max_abs <= tolerance

    def within_rounding(self) -> bool:
        """Within ``ROUNDING_FACTOR`` times the reference's own float32 rounding at this point,
        where float32 is on the path to it (a float64 run with no float32 tensor or operation
        cannot round like float32: a difference there is structure, however small)."""
        return (self.rounding is not None and self.max_abs is not None and self.float32_seen is not False
                and self.max_abs <= ROUNDING_FACTOR * self.rounding)


def compare_points(a: nn.Module, b: nn.Module, inputs: tuple[Tensor | None, ...],
                   names: tuple[str, str] = ("a", "b"), b_float32: nn.Module | None = None,
                   stand_ins: tuple[dict[str, Probe], dict[str, Probe]] = ({}, {}),
                   ) -> list[PointDifference]:
    """Run ``a`` and ``b`` on the same ``inputs`` and compare them at every point, in order of
    computation; ``names`` say which is which in the notes. With ``b_float32`` (``b`` in float32
    where ``b`` is float64), each point also carries ``b``'s own float32 rounding there, and
    whether float32 is on either model's path to it. ``stand_ins`` probe, per model, points it
    declares None because it lacks them (a final norm it does not have) at the nearest output
    that encloses them; the note says so."""
    declared = [resolve_probes(model) for model in (a, b)]
    watched = [capture_watched(model, inputs, extra) for model, extra in zip((a, b), stand_ins, strict=True)]
    values = [got for got, _ in watched]
    float32_after = watched[0][1] | watched[1][1]
    low = capture(b_float32, inputs) if b_float32 is not None else {}
    differences = []
    for point in probe_points(a.config):
        absent = [f"absent in {name}: compared at {extra[point].module or 'its output'}'s output"
                  for name, extra, got in zip(names, stand_ins, values, strict=True)
                  if point in extra and point in got]
        undeclared = [name for name, probes, extra in zip(names, declared, stand_ins, strict=True)
                      if probes[point] is None and point not in extra]
        missing = [name for name, got in zip(names, values, strict=True) if point not in got]
        if undeclared:
            differences.append(PointDifference(point, None, f"not declared by {' or '.join(undeclared)}"))
        elif missing:
            differences.append(PointDifference(point, math.inf, f"not computed by {' or '.join(missing)}"))
        elif values[0][point].shape != values[1][point].shape:
            shapes = " vs ".join(str(tuple(got[point].shape)) for got in values)
            differences.append(PointDifference(point, math.inf, f"shapes differ: {shapes}"))
        else:
            delta = (values[0][point].double() - values[1][point].double()).abs().max().item()
            rounding, seen = None, None
            if point in low and low[point].shape == values[1][point].shape:
                rounding = (low[point].double() - values[1][point].double()).abs().max().item()
                seen = point in float32_after
            differences.append(PointDifference(point, delta, "; ".join(absent), rounding, seen))
    return differences


def first_divergence(differences: list[PointDifference], tolerance: float) -> str:
    """One line: the first point past ``tolerance`` and past float32 rounding, and how closely
    every point before it agrees."""
    index = next((k for k, d in enumerate(differences) if d.diverges(tolerance)), None)
    rounded = any(d.departs(tolerance) for d in differences[:index])
    why = " (float32 rounding)" if rounded else ""
    if index is None:
        if rounded:
            return (f"no divergence past float32 rounding: every point agrees to "
                    f"{number(_worst(differences))}, within the reference's own float32 rounding")
        return f"no divergence: every point agrees to {number(_worst(differences))} (tolerance {tolerance:g})"
    first = differences[index]
    measured = first.max_abs is not None and not math.isinf(first.max_abs)
    how = "; ".join(filter(None, (first.note, f"max |Δ| {number(first.max_abs)}" if measured else "")))
    worst = _worst(differences[:index])
    if index == 0:
        before = "nothing comes before it"
    elif rounded and not worst < (first.max_abs if measured else math.inf):
        before = f"every point before it is within float32 rounding (up to {number(worst)})"
    else:
        before = f"everything before it agrees to {number(worst)}{why}"
    return f"first divergence: {first.point} ({how}); {before}"


def precision_notes(differences: list[PointDifference], tolerance: float) -> list[str]:
    """The first point past ``tolerance`` but within float32 rounding, before any divergence of
    structure, as a note (later points inherit it, so only the first is named)."""
    for difference in differences:
        if difference.diverges(tolerance):
            return []
        if difference.departs(tolerance):
            example = ("a float32 position table" if difference.point.endswith("_embed")
                       else "a tensor or an operation kept in float32, which this run has")
            return [f"{difference.point} differs by {number(difference.max_abs)}: float32 rounding, "
                    f"e.g. {example}"]
    return []


def number(value: float | None) -> str:
    """A difference as the finder prints it: 0, 3.1e-16, 0.41, inf; '-' for none."""
    return "-" if value is None else "0" if value == 0 else f"{value:.2g}"


def _worst(differences: list[PointDifference]) -> float:
    compared = [d.max_abs for d in differences if d.max_abs is not None]
    return max(compared, default=0.0)
