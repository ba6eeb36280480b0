"""The registry: every implementation of the one architecture, built by name.

    model = build("explicit", TransformerConfig(d_model=64, n_heads=4, n_layers=2), seed=0)
    model = build("mypackage.model:Transformer", config, seed=0)   # an outside implementation

With a seed, every variant imports the same canonical weights (``common.weights``), so two
variants built with one seed compute the same function. Besides the registered names, ``build``
takes an outside class as ``package.module:ClassName`` or by the name a package registers it
under in the entry-point group ``transformer_variants.variants`` (``variants.spec``); only then
does it load the checker's adapter (``variants.check.outside``).

The registry names the rows once for every user: ``REFERENCE`` (the ``torch`` row),
``FROM_SCRATCH`` (every other registered variant) and ``TEACHING`` (the three source styles).

The folder: one package per style (explicit/, einsum/, mathfirst/, fused/), reference
(``torch.nn.Transformer`` in the shared embeddings), spec (how an outside variant is named:
``SpecError``, the entry-point group) and check/, ``python -m variants.check SPEC``: anyone's
implementation against the reference (its own index lists its modules).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterable

from torch import nn

from common.config import TransformerConfig
from common.weights import import_weights, init_canonical
from variants.spec import ENTRY_POINT_GROUP, SpecError, registered

__all__ = ["ENTRY_POINT_GROUP", "FROM_SCRATCH", "REFERENCE", "TEACHING", "VARIANTS", "SpecError", "build",
           "ordered", "variant_argument", "variant_class"]

REFERENCE = "torch"  # torch.nn.Transformer in the shared embeddings: every other row is checked against it
# name -> module holding that variant's ``Transformer``; the reference row comes last
_MODULES = {
    "explicit": "variants.explicit",
    "einsum": "variants.einsum",
    "mathfirst": "variants.mathfirst",
    "fused": "variants.fused",
    REFERENCE: "variants.reference",
}
VARIANTS: tuple[str, ...] = tuple(_MODULES)
# every registered variant but the reference: written here, with a key/value cache of its own
FROM_SCRATCH: tuple[str, ...] = tuple(name for name in VARIANTS if name != REFERENCE)
TEACHING = ("explicit", "einsum", "mathfirst")  # one per source text; fused is the speed row


def build(name: str, config: TransformerConfig, seed: int | None = None) -> nn.Module:
    """A fresh model of variant ``name`` (registered, an entry point's or ``package.module:ClassName``);
    with ``seed``, the seeded canonical weights. SpecError says why an outside one cannot be built."""
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
    cls = variant_class(name)
    if name in _MODULES:
        model = cls(config)
    else:
        from variants.check.outside import build_outside  # the checker loads only for an outside class

        model = build_outside(name, cls, config)
    if seed is not None:
        import_weights(model, init_canonical(config, seed))
    return model


def variant_class(name: str) -> type[nn.Module]:
    """The class that ``build(name, ...)`` instantiates (an outside one as declared, unadapted)."""
    if name in _MODULES:
        return importlib.import_module(_MODULES[name]).Transformer
    outside = {} if ":" in name else registered()
    spec = outside.get(name, name)
    if ":" not in spec:
        raise SpecError(f"unknown variant {name!r}; known variants: {', '.join(VARIANTS)}"
                        + (f"; registered under {ENTRY_POINT_GROUP}: {', '.join(outside)}" if outside else "")
                        + "; or name a class as package.module:ClassName")
    from variants.check.outside import import_class

    return import_class(spec)


def variant_argument(text: str) -> str:
    """An argparse ``type`` for a variant name or spec: an unknown one is a one-line usage error."""
    try:
        variant_class(text)
    except SpecError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def ordered(names: Iterable[str]) -> tuple[str, ...]:
    """The registered names among ``names`` in the registry's order, then the others as given; each once."""
    names = list(dict.fromkeys(names))
    return tuple(name for name in VARIANTS if name in names) + tuple(n for n in names if n not in _MODULES)
