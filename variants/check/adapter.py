"""An outside class behind the shared interface: ``interfaced(cls)`` is a subclass of it (and of
the adapter for its protocol) with the same name, parameters and modules, so its maps apply as
declared. The protocols (``variants.check.outside`` says which a class must provide):

- the shared interface itself (subclasses ``common.interface.EncoderDecoder``);
- stages: ``encode(src, src_mask)``, ``decode(tgt, memory, src_mask, tgt_mask)`` and
  ``project(hidden)``; ``forward`` is composed from them;
- forward only: ``forward(src, tgt, src_mask, tgt_mask)`` -> (B, T, V) log-probabilities. The
  class's own methods keep their names: a ``forward`` that calls its own ``encode``/``decode``
  (in whatever argument order) reaches them, not the shared interface's.

A weight map may send a canonical name to ``None``: a tensor the model does not have (attention
biases, say). The adapted class holds a zero placeholder parameter for it, so canonical weights
still import; ``absent_weights`` lists them and the checker treats them (``variants.check.harness``).
A target with ``{h}`` sends a canonical (D, D) projection (and its bias) to per-head layers, head
h holding rows h·D/H to (h + 1)·D/H (``Linear(D, D/H)`` each, the blog tutorials' ``Head``): the
adapted class holds each projection as one parameter and hands each head its rows when the head
runs. ``stack_names = {"encoder": "enc", "decoder": "dec"}`` on the class says what ``{stack}``
stands for in its targets, for a model whose stacks are named otherwise (``enc_blocks``).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from common import checks
from common.config import TransformerConfig
from common.interface import EncoderDecoder
from common.probes import Probe, probe_points
from common.weights import Param, canonical_shapes, first_of_each, match_patterns
from variants.check.patterns import renamed

STAGES = ("encode", "decode", "project")
ABSENT = "absent_placeholders"  # the module holding the zero placeholders of weights mapped to None
PER_HEAD = "per_head_rows"  # the module holding, as one parameter each, the projections sent to heads
STACKS = ("encoder", "decoder")


class MapError(Exception):
    """A weight map entry the adapter cannot apply to the built model (a per-head target)."""


def _target_name(target) -> str | None:
    return target if isinstance(target, str) else target.name if isinstance(target, Param) else \
        target.module if isinstance(target, Probe) else None


# enough layers that a pattern naming one literally still matches a name
_NAMES_CONFIG = TransformerConfig(d_model=8, n_heads=2, n_layers=64, d_ff=8, src_vocab_size=2,
                                  tgt_vocab_size=2)


def with_stack_names(table: dict, names: dict[str, str], points: bool = False) -> dict:
    """``table`` (a weight or probe map) with each entry whose pattern and target hold ``{stack}``
    written once per stack it can match, the target's ``{stack}`` the model's own name for that
    stack (``names``; the canonical name where it gives none)."""
    if not names:
        return table
    known = probe_points(_NAMES_CONFIG) if points else list(canonical_shapes(_NAMES_CONFIG))
    out = {}
    for pattern, target in table.items():
        text = _target_name(target)
        if "{stack}" not in pattern or text is None or "{stack}" not in text:
            out[pattern] = target
            continue
        for stack in STACKS:
            concrete = pattern.replace("{stack}", stack)
            if match_patterns({concrete: None}, known)[0]:
                out[concrete] = renamed(target, text.replace("{stack}", names.get(stack, stack)))
    return out


def _per_head(target) -> bool:
    return "{h}" in (_target_name(target) or "")


@functools.cache
def interfaced(cls: type[nn.Module]) -> type[EncoderDecoder]:
    """``cls`` itself if it is an EncoderDecoder mapping every canonical weight to one tensor;
    else a subclass of it (and of the adapter for its protocol), with the same name, parameters
    and modules (so its maps apply as declared), plus a zero placeholder for each weight it maps
    to ``None``, each projection it sends to heads (``{h}``) held as one parameter, its
    ``stack_names`` written into its maps, and ``config`` kept where the class keeps none."""
    names = getattr(cls, "stack_names", None) or {}
    declared = getattr(cls, "weight_map", None)
    declared = with_stack_names(declared, names) if isinstance(declared, dict) else None
    probes = getattr(cls, "probe_map", None)
    absent = [pattern for pattern, target in (declared or {}).items() if target is None]
    heads = [pattern for pattern, target in (declared or {}).items() if _per_head(target)]
    if issubclass(cls, EncoderDecoder) and not absent and not heads and not names:
        return cls
    namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
                 "_outside": cls, "_declared_map": declared, "__init__": _init_adapted}
    if issubclass(cls, EncoderDecoder):
        bases: tuple[type, ...] = (cls,)
    elif has_stages(cls):
        bases = (_Stages, cls)
    else:
        bases = (_ForwardOnly, cls)
        namespace.update(_own_methods(cls))  # its forward may call them: the interface must not hide them
    if declared is not None and (absent or heads or names):
        namespace["weight_map"] = {
            pattern: Param(f"{ABSENT if target is None else PER_HEAD}.{pattern.replace('.', '_')}")
            if target is None or _per_head(target) else target for pattern, target in declared.items()}
    if names and isinstance(probes, dict):
        namespace["probe_map"] = with_stack_names(probes, names, points=True)
    return type(cls.__name__, bases, namespace)


@functools.cache
def drafting(cls: type[nn.Module]) -> type[EncoderDecoder]:
    """``cls`` behind the interface with its maps left out, as ``--suggest-maps`` reads it: its
    per-head layers as the class builds them."""
    bare = type(cls.__name__, (cls,), {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                      "weight_map": None, "probe_map": None, "stack_names": None})
    return interfaced(bare)


def _init_adapted(self, config: TransformerConfig, *args, **kwargs) -> None:
    """The class's own constructor; then ``config`` where it keeps none, each projection its map
    sends to heads held as one parameter, and a zero parameter for each canonical weight it maps
    to None (``absent_weights``, their canonical names)."""
    adapted = type(self)
    adapted._outside.__init__(self, config, *args, **kwargs)
    if getattr(self, "config", None) is None:
        self.config = config
    declared = adapted._declared_map or {}
    shapes = canonical_shapes(config)
    heads = {pattern: target for pattern, target in declared.items() if _per_head(target)}
    if heads:
        _hold_heads(self, heads, config)
    matched, _ = match_patterns({p: t for p, t in declared.items() if t is None}, shapes)
    if matched:
        placeholders = nn.ParameterDict({name.replace(".", "_"): nn.Parameter(torch.zeros(shapes[name]))
                                         for name in matched})
        self.add_module(ABSENT, placeholders)
    self.absent_weights = tuple(matched)


class RowBlock:
    """A forward pre-hook: before a head's module runs, its weight (or bias) is its rows of the
    one parameter that holds the canonical projection."""

    def __init__(self, rows: nn.ParameterDict, key: str, owner: nn.Module, leaf: str, block: slice) -> None:
        self.rows, self.key, self.owner, self.leaf, self.block = rows, key, owner, leaf, block

    def __call__(self, _module, _args) -> None:
        setattr(self.owner, self.leaf, self.rows[self.key][self.block])


_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


def _hold_heads(model: nn.Module, table: dict, config: TransformerConfig) -> None:
    """Each canonical projection ``table`` sends to heads (``{h}`` in the target) becomes one
    parameter of ``model.per_head_rows``, its rows those of the heads' tensors in head order; each
    head's tensor leaves the model and is that parameter's rows whenever its module runs.
    MapError names every target that does not fit."""
    shapes = canonical_shapes(config)
    matched, _ = match_patterns(table, shapes)
    rows = nn.ParameterDict()
    model.add_module(PER_HEAD, rows)
    size = config.d_model // config.n_heads
    problems = []
    for name, (target, fields) in matched.items():
        if isinstance(target, Param) and (target.layout or target.chunk):
            problems.append((target.name, f"sends {name} to heads with a layout or chunk: per-head targets "
                                          f"take nn.Linear's layout, rows {size} per head"))
            continue
        template = _target_name(target)
        paths = [template.format(**fields, h=h) for h in range(config.n_heads)]
        try:
            pieces = [model.get_parameter(path) for path in paths]
        except AttributeError:
            missing = next(path for path in paths if not _has_parameter(model, path))
            problems.append((template, f"sends {name} to {missing}, which the model lacks"))
            continue
        expected = (size, *shapes[name][1:])
        wrong = next((path for path, piece in zip(paths, pieces, strict=True)
                      if tuple(piece.shape) != expected), None)
        if wrong is not None:
            problems.append((template, f"sends {name} {shapes[name]} to {config.n_heads} heads, {expected} "
                                       f"each, but {wrong} holds {tuple(model.get_parameter(wrong).shape)}"))
            continue
        key = name.replace(".", "_")
        rows[key] = nn.Parameter(torch.cat([piece.detach() for piece in pieces]))
        for h, path in enumerate(paths):
            owner_path, _, leaf = path.rpartition(".")
            owner = model.get_submodule(owner_path)
            delattr(owner, leaf)
            runs = owner_path
            while runs and isinstance(model.get_submodule(runs), _CONTAINERS):
                runs = runs.rpartition(".")[0]  # a list of heads is not called: its holder is
            model.get_submodule(runs).register_forward_pre_hook(
                RowBlock(rows, key, owner, leaf, slice(h * size, (h + 1) * size)))
    if problems:
        raise MapError(f"{type(model).__name__}.weight_map " + "; ".join(first_of_each(problems)))


def _has_parameter(model: nn.Module, path: str) -> bool:
    try:
        model.get_parameter(path)
    except AttributeError:
        return False
    return True


def own_stage(model: nn.Module, stage: str):
    """The stage as the model's own class defines it (behind the shared interface's checks),
    bound to ``model``; None where it defines none."""
    cls = getattr(type(model), "_outside", type(model))
    method = getattr(cls, stage, None)
    return method.__get__(model) if callable(method) else None


def absent_weights(model: nn.Module) -> tuple[str, ...]:
    """The canonical names ``model``'s weight map declares absent (``None``), in canonical order."""
    return tuple(getattr(model, "absent_weights", ()))


class _Stages(EncoderDecoder):
    """The shared interface over an outside model's own encode/decode/project."""

    _outside: type[nn.Module]

    def _encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        return self._outside.encode(self, src, src_mask)

    def _decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None
    ) -> Tensor:
        return self._outside.decode(self, tgt, memory, src_mask, tgt_mask)

    def _project(self, hidden: Tensor) -> Tensor:
        return self._outside.project(self, hidden)


class _ForwardOnly(EncoderDecoder):
    """The shared interface over an outside model's forward: checked, then its own."""

    _outside: type[nn.Module]

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        checks.check_forward(self, src, tgt, src_mask, tgt_mask)
        return self._outside.forward(self, src, tgt, src_mask, tgt_mask)

    def _forward_only(self, *_args) -> Tensor:
        raise NotImplementedError(f"{type(self).__qualname__} implements forward only, not "
                                  f"{'/'.join(STAGES)}")

    _encode = _decode = _project = _forward_only


def _own_methods(cls: type) -> dict[str, object]:
    """The attributes ``cls`` defines itself (not inherited from nn.Module) that the shared
    interface defines too, such as a tutorial's own ``encode`` and ``decode``."""
    shared = {name for name in vars(EncoderDecoder) if not name.startswith("_")} - {"forward"}
    own = {}
    for klass in reversed(cls.__mro__):
        if klass in nn.Module.__mro__:
            continue
        own.update({name: value for name, value in vars(klass).items() if name in shared})
    return own


def has_stages(cls: type) -> bool:
    return all(callable(getattr(cls, stage, None)) for stage in STAGES)
