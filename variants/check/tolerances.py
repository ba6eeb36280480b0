"""The equivalence tolerances, in one home: the checker's battery holds every implementation to
them, and the project's own tests (``tests/helpers.py``) assert with the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    """|actual - expected| <= atol + rtol * |expected| at every element."""

    atol: float
    rtol: float = 0.0

    def __str__(self) -> str:
        return f"{self.atol:g}" + (f" + {self.rtol:g}·|expected|" if self.rtol else "")


FLOAT64 = Tolerance(1e-10)  # docs/architecture.md: log-probs and gradients in float64
FLOAT32 = Tolerance(1e-5, 1.3e-6)  # torch.testing.assert_close's float32 defaults
LOSSES = Tolerance(1e-8)  # docs/architecture.md: optimiser steps in float64
