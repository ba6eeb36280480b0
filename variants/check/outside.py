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

A weight map may send a canonical name to ``None``: a tensor the model does not have (attention
biases, say). The adapted class holds a zero placeholder parameter for it, so canonical weights
still import; ``absent_weights`` lists them and the checker treats them (``variants.check.battery``).
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

import torch
from torch import Tensor, nn

from common import checks
from common.cli import error_line
from common.config import TransformerConfig
from common.interface import EncoderDecoder
from common.probes import resolve_probes
from common.weights import Param, canonical_shapes, check_weight_map, match_patterns
from variants.check.suggest import complete, draft
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
    if not (issubclass(cls, EncoderDecoder) or _has_stages(cls) or cls.forward is not nn.Module.forward):
        raise SpecError(f"{spec} defines neither forward(src, tgt, src_mask, tgt_mask) nor "
                        f"{'/'.join(STAGES)}")
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


def build_outside(spec: str, cls: type[nn.Module], config: TransformerConfig) -> EncoderDecoder:
    """``cls(config)`` behind the shared interface, its signatures, weight map (and probe map)
    checked. NotImplementedError passes through: the class does not support this config."""
    check_signatures(spec, cls)
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
        found = draft(model, config)
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


@functools.cache
def interfaced(cls: type[nn.Module]) -> type[EncoderDecoder]:
    """``cls`` itself if it is an EncoderDecoder mapping every canonical weight; else a subclass of
    it (and of the adapter for its protocol), with the same name, parameters and modules (so its
    maps apply as declared), plus a zero placeholder for each weight it maps to ``None``."""
    declared = getattr(cls, "weight_map", None)
    absent = ([pattern for pattern, target in declared.items() if target is None]
              if isinstance(declared, dict) else [])
    if issubclass(cls, EncoderDecoder) and not absent:
        return cls
    namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
                 "_outside": cls}
    if issubclass(cls, EncoderDecoder):
        bases: tuple[type, ...] = (cls,)
    elif _has_stages(cls):
        bases = (_Stages, cls)
    else:
        bases = (_ForwardOnly, cls)
        namespace.update(_own_methods(cls))  # its forward may call them: the interface must not hide them
    if absent:
        namespace["weight_map"] = {pattern: Param(f"{ABSENT}.{pattern.replace('.', '_')}") if target is None
                                   else target for pattern, target in cls.weight_map.items()}
        namespace["__init__"] = _init_with_placeholders
    return type(cls.__name__, bases, namespace)


def _init_with_placeholders(self, config: TransformerConfig, *args, **kwargs) -> None:
    """The class's own constructor, then a zero parameter for each canonical weight it maps to
    None, and ``absent_weights``, their canonical names."""
    outside = type(self)._outside
    outside.__init__(self, config, *args, **kwargs)
    shapes = canonical_shapes(config)
    declared = {pattern: None for pattern, target in outside.weight_map.items() if target is None}
    matched, _ = match_patterns(declared, shapes)
    placeholders = nn.ParameterDict({name.replace(".", "_"): nn.Parameter(torch.zeros(shapes[name]))
                                     for name in matched})
    self.add_module(ABSENT, placeholders)
    self.absent_weights = tuple(matched)


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
