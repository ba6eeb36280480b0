"""Outside implementations: a class named ``package.module:ClassName``, or registered by a package
under the entry-point group ``transformer_variants.variants``, built like a registered variant.

The class is built as ``Cls(config)`` from a ``TransformerConfig`` and declares ``weight_map``
(and, for the divergence finder, ``probe_map``) as the built-in variants do. It implements the
shared interface (subclasses ``common.interface.EncoderDecoder``) or one of two smaller protocols,
which ``interfaced`` puts behind the shared interface, input checks included:

- stages: ``encode(src, src_mask)``, ``decode(tgt, memory, src_mask, tgt_mask)`` and
  ``project(hidden)``; ``forward`` is composed from them;
- forward only: ``forward(src, tgt, src_mask, tgt_mask)`` -> (B, T, V) log-probabilities.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import sys

from torch import Tensor, nn

from common import checks
from common.cli import error_line
from common.config import TransformerConfig
from common.interface import EncoderDecoder
from common.probes import resolve_probes
from common.weights import check_weight_map

ENTRY_POINT_GROUP = "transformer_variants.variants"
STAGES = ("encode", "decode", "project")


class SpecError(ValueError):
    """A variant that cannot be built as named; the message says why, in one line."""


def registered() -> dict[str, str]:
    """name -> ``package.module:ClassName`` for every entry point of ``ENTRY_POINT_GROUP``."""
    return {point.name: point.value for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


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
    if not isinstance(getattr(cls, "weight_map", None), dict):
        raise SpecError(f"{spec} declares no weight_map: a dict from canonical names to its parameters")
    if not (issubclass(cls, EncoderDecoder) or _has_stages(cls) or cls.forward is not nn.Module.forward):
        raise SpecError(f"{spec} defines neither forward(src, tgt, src_mask, tgt_mask) nor "
                        f"{'/'.join(STAGES)}")
    return cls


def build_outside(spec: str, cls: type[nn.Module], config: TransformerConfig) -> EncoderDecoder:
    """``cls(config)`` behind the shared interface, its weight map (and probe map) checked."""
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
        raise SpecError(f"{spec}: {error}") from error
    return model


@functools.cache
def interfaced(cls: type[nn.Module]) -> type[EncoderDecoder]:
    """``cls`` itself if it is an EncoderDecoder; else a subclass of it and of the adapter for its
    protocol, with the same name, parameters and modules (so its maps apply as declared)."""
    if issubclass(cls, EncoderDecoder):
        return cls
    adapter = _Stages if _has_stages(cls) else _ForwardOnly
    return type(cls.__name__, (adapter, cls), {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                               "__doc__": cls.__doc__, "_outside": cls})


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


def _has_stages(cls: type) -> bool:
    return all(callable(getattr(cls, stage, None)) for stage in STAGES)
