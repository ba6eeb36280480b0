"""Outside implementations: a class named ``package.module:ClassName``, or registered by a package
under the entry-point group ``transformer_variants.variants``, built like a registered variant.

The class is built as ``Cls(config)`` from a ``TransformerConfig`` and declares ``weight_map``
(and, for the divergence finder, ``probe_map``) as the built-in variants do. It implements the
shared interface (subclasses ``common.interface.EncoderDecoder``), or stages (``encode``,
``decode``, ``project``), or ``forward`` only, which ``variants.check.adapter`` puts behind the
shared interface, input checks included.

What a class must provide, checked in this order before anything else (``requirements``): a
``torch.nn.Module`` subclass; a constructor called as ``Cls(config)``, one TransformerConfig
(``self.config`` is set for it where it keeps none); ``forward`` or the three stages. The maps are
optional (``inferred``, drafted by ``variants.check.suggest``); a map may declare weights absent
(``None``) or send projections to per-head layers (``{h}``), ``stack_names`` say what ``{stack}``
stands for (``variants.check.adapter``).
A class that supports one norm mode only says so with ``norm_modes = ("pre",)`` (or
``("post",)``), or raises ``NotImplementedError`` from its constructor for the other.
Before anything is built, ``check_signatures`` refuses stages whose recognisable argument names
come in another order than the suite calls them in.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
import traceback

from torch import nn

from common.cli import error_line
from common.config import TransformerConfig
from common.interface import EncoderDecoder
from common.probes import resolve_probes
from common.weights import check_weight_map
from variants.check.adapter import ABSENT, STACKS, STAGES, MapError, has_stages, interfaced
from variants.check.divergence import model_frame
from variants.check.patterns import complete
from variants.check.suggest import draft
from variants.spec import SpecError

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
    if not (issubclass(cls, EncoderDecoder) or has_stages(cls) or cls.forward is not nn.Module.forward):
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
    if has_stages(cls):
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
    stages = ("encode", "decode") if has_stages(cls) else ("forward",)
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

