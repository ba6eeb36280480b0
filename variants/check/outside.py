"""Outside implementations: a class named ``package.module:ClassName``, or registered by a package
under the entry-point group ``transformer_variants.variants``, built like a registered variant.

The class is built as ``Cls(config)`` from a ``TransformerConfig`` and declares ``weight_map``
(and, for the divergence finder, ``probe_map``) as the built-in variants do. It implements the
shared interface (subclasses ``common.interface.EncoderDecoder``) or one of two smaller protocols,
which ``interfaced`` puts behind the shared interface, input checks included:

- stages: ``encode(src, src_mask)``, ``decode(tgt, memory, src_mask, tgt_mask)`` and
  ``project(hidden)``; ``forward`` is composed from them;
- forward only: ``forward(src, tgt, src_mask, tgt_mask)`` -> (B, T, V) log-probabilities. The
  class's own methods keep their names: a ``forward`` that calls its own ``encode``/``decode``
  (in whatever argument order) reaches them, not the shared interface's.

What a class must provide, checked in this order before anything else (``requirements``): a
``torch.nn.Module`` subclass; a constructor called as ``Cls(config)``, one TransformerConfig
(``self.config`` is set for it where it keeps none); ``forward`` or the three stages. The maps are
optional (``inferred``).

A weight map may send a canonical name to ``None``: a tensor the model does not have (attention
biases, say). The adapted class holds a zero placeholder parameter for it, so canonical weights
still import; ``absent_weights`` lists them and the checker treats them (``variants.check.battery``).
A target with ``{h}`` sends a canonical (D, D) projection (and its bias) to per-head layers, head
h holding rows h·D/H to (h + 1)·D/H (``Linear(D, D/H)`` each, the blog tutorials' ``Head``): the
adapted class holds each projection as one parameter and hands each head its rows when the head
runs. ``stack_names = {"encoder": "enc", "decoder": "dec"}`` on the class says what ``{stack}``
stands for in its targets, for a model whose stacks are named otherwise (``enc_blocks``).
A class that supports one norm mode only says so with ``norm_modes = ("pre",)`` (or
``("post",)``), or raises ``NotImplementedError`` from its constructor for the other.
Before anything is built, ``check_signatures`` refuses stages whose recognisable argument names
come in another order than the suite calls them in.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
import sys
import traceback

import torch
from torch import Tensor, nn

from common import checks
from common.cli import error_line
from common.config import TransformerConfig
from common.interface import EncoderDecoder
from common.probes import Probe, probe_points, resolve_probes
from common.weights import Param, canonical_shapes, check_weight_map, first_of_each, match_patterns
from variants.check.divergence import model_frame
from variants.check.suggest import _renamed, complete, draft
from variants.spec import SpecError

STAGES = ("encode", "decode", "project")
NORM_MODES = {"post": False, "pre": True}  # a class's norm_modes -> TransformerConfig.norm_first

# How the suite calls each stage, and the argument names people commonly give each role.
SIGNATURES = {
    "encode": ("src", "src_mask"),
    "decode": ("tgt", "memory", "src_mask", "tgt_mask"),
    "forward": ("src", "tgt", "src_mask", "tgt_mask"),
}
ROLE_NAMES = {
    "src": {"src", "source", "src_ids", "src_tokens", "encoder_input", "enc_input"},
    "tgt": {"tgt", "trg", "target", "tgt_ids", "tgt_tokens", "decoder_input", "dec_input"},
    "memory": {"memory", "mem", "encoder_output", "encoder_out", "enc_output", "enc_out", "encoder_outputs",
               "enc_src"},
    "src_mask": {"src_mask", "source_mask", "enc_mask", "memory_mask", "src_key_mask"},
    "tgt_mask": {"tgt_mask", "trg_mask", "target_mask", "dec_mask"},
}
# Spellings beyond those: a word in the name says the role (trg_token_ids_batch, e_outputs,
# src_representations_batch, dec_enc_attn_mask); a mask's own words are read first.
ROLE_WORDS = (
    ("src_mask", re.compile(r"mask.*(src|source|enc|mem|cross)|(src|source|enc|mem|cross).*mask", re.I)),
    ("tgt_mask", re.compile(r"mask.*(trg|tgt|target|dec|self|causal|look)|(trg|tgt|target|dec|self|causal)"
                            r".*mask", re.I)),
    ("memory", re.compile(r"memory|^mem_|^e_out|enc.*out|representation|context|hidden", re.I)),
    ("tgt", re.compile(r"^(trg|tgt|target|dec)(?!.*mask)", re.I)),
    ("src", re.compile(r"^(src|source|inp)(?!.*mask)", re.I)),
)
ABSENT = "absent_placeholders"  # the module holding the zero placeholders of weights mapped to None
PER_HEAD = "per_head_rows"  # the module holding, as one parameter each, the projections sent to heads
STACKS = ("encoder", "decoder")


def import_class(spec: str) -> type[nn.Module]:
    """The class ``package.module:ClassName`` names, found on sys.path or in the current directory,
    checked to be a module class with a weight map and one of the protocols."""
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name.isidentifier():
        raise SpecError(f"{spec!r} is not package.module:ClassName")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # as `python -m` would have it: a package in the current directory
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise SpecError(f"{spec}: cannot import {module_name} ({error_line(error)})") from error
    cls = getattr(module, class_name, None)
    if cls is None:
        raise SpecError(f"{spec}: module {module_name} has no attribute {class_name}")
    if not isinstance(cls, type):
        raise SpecError(f"{spec} is a {type(cls).__name__}, not a class")
    if not issubclass(cls, nn.Module):
        raise SpecError(f"{spec} is not a torch.nn.Module subclass")
    unmet = requirements(cls)
    if unmet:
        raise SpecError(f"{spec}: " + "; ".join(unmet))
    if not isinstance(getattr(cls, "weight_map", None), dict):  # no maps: can they be inferred at all?
        for norm_first in (False, True):
            try:
                inferred(spec, cls, PROBE_CONFIG.replace(norm_first=norm_first))
                break
            except NotImplementedError:
                continue
            except SpecError as error:
                if not isinstance(error.__cause__, Exception):  # a shape of this config: decided at build
                    break
                raise
    return cls


def requirements(cls: type[nn.Module]) -> list[str]:
    """What ``cls`` lacks of what the checker needs, one line each: a constructor called as
    ``Cls(config)``, and ``forward`` or the three stages."""
    unmet = []
    try:
        signature = inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        try:
            signature.bind(None, None)  # self, config
        except TypeError:
            takes = ", ".join(name for name in list(signature.parameters)[1:])
            unmet.append(f"the checker builds {cls.__name__}(config) from one TransformerConfig, but "
                         f"{cls.__name__}.__init__ takes ({takes}): subclass it with __init__(self, config) "
                         f"calling super().__init__(config.d_model, ...)")
    if not (issubclass(cls, EncoderDecoder) or _has_stages(cls) or cls.forward is not nn.Module.forward):
        unmet.append(f"{cls.__name__} defines neither forward(src, tgt, src_mask, tgt_mask) nor "
                     f"{'/'.join(STAGES)}")
    return unmet


def stack_names(spec: str, cls: type[nn.Module]) -> dict[str, str]:
    """The class's ``stack_names`` (what ``{stack}`` stands for in its map targets), checked."""
    names = getattr(cls, "stack_names", None)
    if names is None:
        return {}
    if not (isinstance(names, dict) and set(names) <= set(STACKS)
            and all(isinstance(name, str) and name for name in names.values())):
        raise SpecError(f"{spec}: stack_names must map 'encoder' and/or 'decoder' to the model's own names "
                        f"for them, got {names!r}")
    return names


def build_outside(spec: str, cls: type[nn.Module], config: TransformerConfig) -> EncoderDecoder:
    """``cls(config)`` behind the shared interface, its signatures, weight map (and probe map)
    checked. NotImplementedError passes through: the class does not support this config."""
    check_signatures(spec, cls)
    stack_names(spec, cls)
    if not isinstance(getattr(cls, "weight_map", None), dict):
        cls = inferred(spec, cls, config)
    modes = getattr(cls, "norm_modes", None)
    if modes is not None:
        if not set(modes) <= set(NORM_MODES):
            raise SpecError(f"{spec}: norm_modes must hold 'post' and/or 'pre', got {modes!r}")
        mode = "pre" if config.norm_first else "post"
        if mode not in modes:
            raise NotImplementedError(f"{cls.__name__}.norm_modes is {tuple(modes)!r}")
    try:
        model = interfaced(cls)(config)
    except NotImplementedError:
        raise  # the class says it does not support this config (pre-norm, say)
    except MapError as error:
        raise SpecError(f"{spec}: {error}") from error
    except Exception as error:
        raise SpecError(f"{spec}: {cls.__name__}(config) raised {error_line(error)}") from error
    if getattr(model, "config", None) is None:
        model.config = config
    if model.config != config:
        raise SpecError(f"{spec}: .config must be the TransformerConfig it was built from, "
                        f"got {type(model.config).__name__}")
    try:
        check_weight_map(model)
        if hasattr(cls, "probe_map"):
            resolve_probes(model)
    except LookupError as error:
        raise SpecError(f"{spec}: {error}{tying_hint(model)}") from error
    return model


def tied_parameters(model: nn.Module) -> list[tuple[str, str]]:
    """(first name, another name) of each parameter the model holds under two names."""
    first: dict[int, str] = {}
    pairs = []
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            pairs.append((first[id(param)], name))
        else:
            first[id(param)] = name
    return pairs


def tying_hint(model: nn.Module) -> str:
    """Where a map fails on a model with tied weights: say which, and how to check a tied model."""
    pairs = [pair for pair in tied_parameters(model) if not pair[1].startswith(ABSENT)]
    if not pairs:
        return ""
    tied = "; ".join(f"{other} is {first}" for first, other in pairs[:3])
    if model.config.share_embeddings:
        return (f"; hint: tied weights ({tied}): send src_embed.weight, tgt_embed.weight and "
                f"generator.weight to it")
    return (f"; hint: the model ties weights ({tied}, one tensor): check a tied model against the tied "
            f"reference with --share-embeddings")


# a small config to ask a class without maps whether they can be inferred at all
PROBE_CONFIG = TransformerConfig(d_model=32, n_heads=4, n_layers=2, d_ff=128, dropout=0.0, src_vocab_size=23,
                                 tgt_vocab_size=19, max_seq_len=40)
_INFERRED: dict[tuple[type, TransformerConfig], type] = {}


def inferred(spec: str, cls: type[nn.Module], config: TransformerConfig) -> type[nn.Module]:
    """``cls`` with the weight_map and probe_map ``variants.check.suggest`` drafts from its modules (a
    class that declares neither); SpecError naming what could not be placed."""
    key = (cls, config)
    if key not in _INFERRED:
        try:
            model = interfaced(cls)(config)
        except NotImplementedError:
            raise
        except Exception as error:
            raise SpecError(f"{spec} declares no weight_map, and none could be inferred: "
                            f"{cls.__name__}(config) raised {error_line(error)}") from error
        try:
            found = draft(model, config)
        except Exception as error:  # a module the draft cannot read: one line, not a traceback
            place = model_frame(traceback.extract_tb(error.__traceback__))
            raise SpecError(f"{spec} declares no weight_map, and its modules cannot be read to infer one: "
                            f"{error_line(error)}{f' (at {place})' if place else ''}; write one "
                            f"(docs/check.md)") from error
        missing = complete(found, config)
        if not any(True for _ in model.parameters()):
            raise SpecError(f"{spec} declares no weight_map, and has no parameters to infer one from") \
                from LookupError("no parameters")
        if missing:
            why = "; ".join([*found.notes, f"not placed: {', '.join(missing[:4])}"
                             + (" ..." if len(missing) > 4 else "")])
            raise SpecError(f"{spec} declares no weight_map, and none could be inferred from its modules "
                            f"({why}); write one (docs/check.md)")
        namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
                     "weight_map": dict(found.weights),
                     "probe_map": {point: probe for point, probe in found.probes.items()},
                     "extra_parameters": (*getattr(cls, "extra_parameters", ()), *found.unplaced),
                     "inferred_maps": True}
        _INFERRED[key] = type(cls.__name__, (cls,), namespace)
    return _INFERRED[key]


def protocol(cls: type[nn.Module]) -> str:
    """How the checker calls ``cls``, and why, in a few words."""
    cls = getattr(cls, "_outside", cls)
    if issubclass(cls, EncoderDecoder):
        return "the shared interface"
    if _has_stages(cls):
        return "stages: encode, decode, project"
    have = [stage for stage in STAGES if callable(getattr(cls, stage, None))]
    lacks = [stage for stage in STAGES if stage not in have]
    why = (f"it defines {' and '.join(have)} but no {' or '.join(lacks)}" if have
           else f"it defines none of {'/'.join(STAGES)}")
    return f"forward only ({why}): every check calls forward(src, tgt, src_mask, tgt_mask)"


def check_signatures(spec: str, cls: type[nn.Module]) -> None:
    """Refuse (SpecError) a stage whose parameters all have recognisable names (``ROLE_NAMES``)
    in another order than the suite calls them in; names it cannot read are left to run."""
    if issubclass(cls, EncoderDecoder):
        return
    stages = ("encode", "decode") if _has_stages(cls) else ("forward",)
    for stage in stages:
        try:
            parameters = list(inspect.signature(getattr(cls, stage)).parameters.values())[1:]  # after self
        except (TypeError, ValueError):
            continue
        names = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        expected = SIGNATURES[stage]
        roles = tuple(role_of(name) for name in names[: len(expected)])
        if None not in roles and sorted(roles) == sorted(expected) and roles != expected:
            raise SpecError(f"{spec}: {cls.__name__}.{stage} takes ({', '.join(names)}), but the suite calls "
                            f"{stage}({', '.join(expected)}): put its arguments in that order, or wrap it")


def role_of(name: str) -> str | None:
    """The suite's role for an argument name (``ROLE_NAMES``, then ``ROLE_WORDS``); None if unsure."""
    known = next((role for role, names in ROLE_NAMES.items() if name in names), None)
    return known or next((role for role, words in ROLE_WORDS if words.search(name)), None)


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
                out[concrete] = _renamed(target, text.replace("{stack}", names.get(stack, stack)))
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
    elif _has_stages(cls):
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


def _has_stages(cls: type) -> bool:
    return all(callable(getattr(cls, stage, None)) for stage in STAGES)
