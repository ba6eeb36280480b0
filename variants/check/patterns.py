"""The draft as patterns and as Python to paste: concrete maps (``Draft``) generalised with
``{i}``, ``{stack}`` and ``{kind}`` where every instance agrees (``weight_patterns``,
``probe_patterns``), what they leave out (``complete``), and the text ``--suggest-maps`` prints
(``as_python``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from common.config import TransformerConfig
from common.probes import Probe, probe_points
from common.weights import Param, canonical_shapes


@dataclass
class Draft:
    """Concrete maps (canonical name or point -> the model's name) and what could not be placed."""

    weights: dict[str, str | Param | None] = field(default_factory=dict)
    probes: dict[str, Probe | None] = field(default_factory=dict)
    unplaced: list[str] = field(default_factory=list)  # the model's parameters no canonical name took
    notes: list[str] = field(default_factory=list)  # why a point or a weight is missing
    layers: dict[tuple[str, int], str] = field(default_factory=dict)  # (stack, i) -> the layer's module
    heads: int = 1  # H, for the {h} of per-head targets
    verdict: str = ""  # what running the draft showed (variants.check.verify): verified, corrected, ...
    corrected: dict[str, str] = field(default_factory=dict)  # canonical name or point -> what changed it

def target_name(target) -> str | None:
    return None if target is None else target if isinstance(target, str) else (
        target.name if isinstance(target, Param) else target.module)


def renamed(target, name: str):
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
            layer, path = layers[(match.group(1), int(match.group(2)))], target_name(target)
            if path is None or path == layer or path.startswith(layer + "."):
                rest = None if path is None else renamed(target, template + path[len(layer):])
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
                mine = renamed(mine, _with_stack(target_name(mine), cores[stack]))
            if theirs is not None:
                theirs = renamed(theirs, _with_stack(target_name(theirs), cores[other]))
            if mine == theirs and (target is None or "{stack}" in target_name(mine)):
                merged["{stack}" + name[len(stack):]] = mine
                continue
        merged[name] = target
    kinds: dict = {}
    for name, target in merged.items():
        base, _, kind = name.rpartition(".")
        weight, bias = merged.get(f"{base}.weight", "-"), merged.get(f"{base}.bias", "-")
        same = (weight is None and bias is None) or (
            type(weight) is type(bias) and target_name(weight) is not None
            and target_name(weight).endswith("weight")
            and bias == renamed(weight, target_name(weight)[: -len("weight")] + "bias"))
        if kind in ("weight", "bias") and same:
            kinds[f"{base}.{{kind}}"] = None if weight is None else \
                renamed(weight, target_name(weight)[: -len("weight")] + "{kind}")
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


def _mark(pattern: str, corrected: dict[str, str]) -> str:
    """A comment for a pattern entry that covers a corrected one: what changed it."""
    if not corrected:
        return ""
    shape = re.escape(pattern).replace(r"\{i\}", r"\d+").replace(r"\{stack\}", "(?:encoder|decoder)")
    shape = shape.replace(r"\{kind\}", "(?:weight|bias)")
    return next((f"  # {why}" for name, why in corrected.items() if re.fullmatch(shape, name)), "")


def as_python(found: Draft, config: TransformerConfig, name: str) -> str:
    """The draft as Python to paste into the class ``name``."""
    lines = [f"# drafted by python -m variants.check --suggest-maps for {name}; read it before trusting it"]
    if found.verdict:
        lines.append(f"# {found.verdict}")
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
    per_head = any("{h}" in (target_name(target) or "") for target in found.weights.values())
    lines.append("weight_map = {" + ("  # {h}: each head's layer, holding its rows of the canonical matrix"
                                     if per_head else ""))
    lines += [f"    {key!r}: {value!r},{_mark(key, found.corrected)}"
              for key, value in weight_patterns(found).items()]
    lines.append("}")
    lines.append("probe_map = {  # Probe: from common.probes; Param (in weight_map): from common.weights")
    lines += [f"    {key!r}: {value!r},{_mark(key, found.corrected)}"
              for key, value in probe_patterns(found).items()]
    lines.append("}")
    return "\n".join(lines)
