"""The divergence finder: two implementations compared at every probe point (``common.probes``),
in order of computation, and the first point where they part named.

The finder separates precision from structure: measured against the reference's own float32
rounding at each point (the reference run in float32 against itself in float64), a float64
difference within a few times that is float32 rounding (a float32 table, say), noted but not
named as the divergence; the first point past it is. ``Float32Watch`` sees whether float32 is
on the path to a point at all: a float64 run with none cannot round like float32.
"""

from __future__ import annotations

import math
import os
import re
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from common.probes import Probe, capture, probe_points, resolve_probes

LOW_PRECISION = (torch.float32, torch.float16, torch.bfloat16)
_ROOT = Path(__file__).resolve().parents[2]
_SUITE = tuple(str(_ROOT / package) + os.sep for package in ("common", "variants"))  # not the model's code
_TORCH = str(Path(torch.__file__).resolve().parent) + os.sep


def model_frame(frames: list[traceback.FrameSummary]) -> str:
    """``file:line in function`` of the innermost of ``frames`` in the model's own code (not
    torch's, not the suite's); "" if none is."""
    own = [frame for frame in frames
           if not frame.filename.startswith((_TORCH, *_SUITE)) and not frame.filename.startswith("<")]
    if not own:
        return ""
    frame = own[-1]
    path = os.path.relpath(frame.filename) if frame.filename.startswith(os.getcwd()) else frame.filename
    return f"{path}:{frame.lineno} in {frame.name}"


def float32_valued(tensor: Tensor) -> bool:
    """A float64 tensor whose every value is a float32 number and not all are integers: a table
    computed in float32 and cast up (a float64 computation almost never lands on float32 values)."""
    if tensor.dtype != torch.float64 or tensor.numel() == 0:
        return False
    return (bool(torch.equal(tensor.float().double(), tensor))
            and not bool(torch.equal(tensor.round(), tensor)))


class Float32Watch(TorchDispatchMode):
    """Sees every operation of a forward pass and notes each source of float32 rounding in a
    float64 run: a buffer or a frozen parameter (one that does not train: Hugging Face's sinusoid
    tables) holding float32 values, and each operation that makes a tensor of lower precision than
    float64 from inputs that are not (a cast); what follows from a source is not another.
    ``seen``: any so far; ``sources``: each, in plain words and where (``source`` joins them)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.seen = False
        self.sources: list[str] = []  # each source once, in the order met
        fixed = [*(("buffer", name, buffer) for name, buffer in model.named_buffers()),
                 *(("frozen parameter", name, param) for name, param in model.named_parameters()
                   if not param.requires_grad)]
        self.storages = {tensor.untyped_storage().data_ptr(): f"{kind} {name}" for kind, name, tensor in fixed
                         if float32_valued(tensor)}

    @property
    def source(self) -> str:
        return "; ".join(self.sources)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [item for item in _leaves((args, kwargs)) if isinstance(item, Tensor)]
        outputs = [item for item in _leaves(out) if isinstance(item, Tensor)]
        for item in inputs:
            table = self.storages.pop(item.untyped_storage().data_ptr(), None) if self.storages else None
            if table is not None:
                self._note(f"{table} holds float32 values (a table computed in float32, then cast up)")
        if any(item.dtype in LOW_PRECISION for item in outputs) and \
                not any(item.dtype in LOW_PRECISION for item in inputs):
            low = next(item.dtype for item in outputs if item.dtype in LOW_PRECISION)
            self._note(_cast_words(getattr(func, "overloadpacket", func).__name__, str(low)[6:]))
        elif any(item.dtype in LOW_PRECISION for item in inputs):
            self.seen = True
        return out

    def _note(self, what: str) -> None:
        self.seen = True
        frames = traceback.extract_stack()[:-2]
        place = model_frame(frames)
        own = [frame for frame in frames if place.endswith(f":{frame.lineno} in {frame.name}")]
        line = own[-1].line or "" if own else ""
        if what.startswith("computation casts") and re.search(r"softmax|scores|attn|logits", line):
            what = f"attention softmax runs in {what.rpartition(' ')[2]} (a cast before it)"
        text = what + (f", at {place}" if place else "")
        if text not in self.sources:
            self.sources.append(text)


def _cast_words(operation: str, dtype: str) -> str:
    """An operation that makes a lower-precision tensor from float64 ones, in plain words."""
    if operation in ("_to_copy", "to", "copy_", "clone"):
        return f"computation casts a tensor to {dtype}"
    return f"operation {operation} makes a {dtype} tensor from float64 ones"


def _leaves(tree) -> list:
    """The items of nested tuples, lists and dicts."""
    if isinstance(tree, (tuple, list)):
        return [leaf for item in tree for leaf in _leaves(item)]
    if isinstance(tree, dict):
        return [leaf for item in tree.values() for leaf in _leaves(item)]
    return [tree]


def capture_watched(model: nn.Module, inputs: tuple[Tensor | None, ...],
                    stand_ins: dict[str, Probe] | None = None, notes: dict[str, str] | None = None,
                    ) -> tuple[dict[str, Tensor], set[str], list[str]]:
    """``capture``, the points computed after float32 evidence (``Float32Watch``), and each
    source of it (none: [])."""
    watch, after = Float32Watch(model), set()

    def note(point: str) -> None:
        if watch.seen:
            after.add(point)

    values = capture(model, inputs, stand_ins, during=watch, on_point=note, notes=notes)
    return values, after, watch.sources


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
    float32_source: str = ""  # which model carries float32, and what (Float32Watch.source)

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
    read: list[dict[str, str]] = [{}, {}]  # per model: point -> how a tuple output was read
    watched = [capture_watched(model, inputs, extra, notes)
               for model, extra, notes in zip((a, b), stand_ins, read, strict=True)]
    values = [got for got, _, _ in watched]
    float32_after = watched[0][1] | watched[1][1]
    source = "; ".join(f"{name}'s {why}" for name, (_, _, sources) in zip(names, watched, strict=True)
                       for why in sources)
    low = capture(b_float32, inputs) if b_float32 is not None else {}
    differences = []
    for point in probe_points(a.config):
        absent = [f"absent in {name}: compared at {_read(extra[point])}"
                  for name, extra, got in zip(names, stand_ins, values, strict=True)
                  if point in extra and point in got]
        absent += [f"{name}'s {notes[point]}" for name, notes in zip(names, read, strict=True)
                   if point in notes and "not a tensor" not in notes[point]]
        undeclared = [name for name, probes, extra in zip(names, declared, stand_ins, strict=True)
                      if probes[point] is None and point not in extra]
        missing = [name for name, got in zip(names, values, strict=True) if point not in got]
        unread = [f"{name}'s {notes[point]}" for name, notes in zip(names, read, strict=True)
                  if point in notes and "not a tensor" in notes[point]]
        if undeclared:
            differences.append(PointDifference(point, None, f"not declared by {' or '.join(undeclared)}"))
        elif unread:
            differences.append(PointDifference(point, math.inf, "; ".join(unread)))
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
            differences.append(PointDifference(point, delta, "; ".join(absent), rounding, seen,
                                               source if seen else ""))
    return differences


def _read(probe: Probe) -> str:
    """Where a stand-in probe reads, as the finder says it."""
    where = f"{probe.module or 'the model'}'s output"
    return where + (f", item {probe.item}" if probe.item is not None else "")


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
    elif all(d.max_abs is None for d in differences[:index]):
        before = "no point before it is probed"
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
            why = difference.float32_source or f"e.g. {example}"
            return [f"{difference.point} differs by {number(difference.max_abs)}: float32 rounding, {why}"]
    return []


def number(value: float | None) -> str:
    """A difference as the finder prints it: 0, 3.1e-16, 0.41, inf; '-' for none."""
    return "-" if value is None else "0" if value == 0 else f"{value:.2g}"


def _worst(differences: list[PointDifference]) -> float:
    compared = [d.max_abs for d in differences if d.max_abs is not None]
    return max(compared, default=0.0)
