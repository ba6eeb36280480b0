"""How an outside variant is named, without loading the checker: the entry-point group packages
register classes under, the names registered there, and ``SpecError``, the one-line error for a
variant that cannot be built as named. ``variants`` and ``variants.check`` both import from here."""

from __future__ import annotations

import importlib.metadata

ENTRY_POINT_GROUP = "transformer_variants.variants"


class SpecError(ValueError):
    """A variant that cannot be built as named; the message says why, in one line."""


def registered() -> dict[str, str]:
    """name -> ``package.module:ClassName`` for every entry point of ``ENTRY_POINT_GROUP``."""
    return {point.name: point.value for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
