"""The checker's own thresholds, tested from outside: a copy of explicit whose every checked
quantity is moved by a chosen fraction of that check's documented tolerance passes every check
at 0.8 of it and fails every one at 1.25, and ``python -m variants.check`` exits 0 and 1.

The tolerances are written here as docs/check.md states them, not read from the checker, so a
checker whose thresholds drift (a float32 tolerance loosened a hundredfold, say) fails here.
"""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from torch import Tensor

from variants.check.__main__ import main
from variants.explicit.model import Transformer as Explicit

SPEC = f"{__name__}:Nudged"
FLOAT64_ATOL = 1e-10  # forward log-probs and gradients in float64, the fully masked row
FLOAT32_ATOL, FLOAT32_RTOL = 1e-5, 1.3e-6  # forward log-probs in float32: atol + rtol·|expected|
LOSSES_ATOL = 1e-8  # the losses of the Adam steps, float64
# every kind of check with a tolerance, each run post- and pre-norm
TOLERANCE_CHECKS = ("forward float64", "forward float32", "gradients float64", "3 Adam steps float64",
                    "fully masked source row")


class Nudged(Explicit):
    """explicit with each checked quantity moved by ``fraction`` of its check's tolerance.

    In eval mode (the forward checks) every log-probability moves by the forward tolerance of
    its dtype. In train mode (the gradient and Adam-step checks) every log-probability moves by
    a constant, which moves the loss by the losses' tolerance and no gradient, plus a term that
    is zero in value and moves the generator bias's first gradient by the float64 tolerance.
    """

    fraction: ClassVar[float] = 0.0

    def _project(self, hidden: Tensor) -> Tensor:
        log_probs = super()._project(hidden)  # (B, T, V)
        if not self.training:
            if log_probs.dtype == torch.float64:
                return log_probs + self.fraction * FLOAT64_ATOL
            allowed = FLOAT32_ATOL + FLOAT32_RTOL * log_probs.double().abs()  # (B, T, V)
            return (log_probs.double() + self.fraction * allowed).to(log_probs.dtype)
        first_bias = self.projection.linear.bias[0]
        # the mean NLL over the labels loses this constant once, and gains -d/d(bias 0) of it
        zero_valued = first_bias - first_bias.detach()
        return log_probs + self.fraction * (LOSSES_ATOL + FLOAT64_ATOL * zero_valued)


def table(output: str) -> dict[str, tuple[str, str]]:
    """check -> (verdict "pass" / "FAIL", largest |Δ| as printed), from the command's table."""
    rows = {}
    for line in output.splitlines():
        for verdict in (" pass ", " FAIL "):
            if line.startswith((*TOLERANCE_CHECKS, "bad inputs")) and verdict in line:
                check, rest = line.split(verdict, 1)
                rows[check.strip()] = (verdict.strip(), rest.split()[0])
    return rows


@pytest.mark.parametrize("fraction, status", [(0.8, 0), (1.25, 1)])
def test_each_threshold_passes_just_below_and_fails_just_above(fraction, status, monkeypatch, capsys):
    """Against explicit itself, so the unnudged difference is exactly zero and each float64
    check's largest |Δ| is its nudge: every check with a tolerance, float64 and float32, post-
    and pre-norm, lands on the side its nudge puts it, and the exit status says so."""
    monkeypatch.setattr(Nudged, "fraction", fraction)
    assert main([SPEC, "--against", "explicit"]) == status
    rows = table(capsys.readouterr().out)
    checked = {check: row for check, row in rows.items() if check.startswith(TOLERANCE_CHECKS)}
    assert all(any(check.startswith(kind) for check in checked) for kind in TOLERANCE_CHECKS), rows
    assert all(any(mode in check for check in checked) for mode in ("post-norm", "pre-norm")), rows
    expected = "pass" if fraction < 1 else "FAIL"
    assert {verdict for verdict, _ in checked.values()} == {expected}, checked
    assert [verdict for check, (verdict, _) in rows.items() if check.startswith("bad inputs")] == ["pass"]
    nudges = {"forward float64": FLOAT64_ATOL, "gradients float64": FLOAT64_ATOL,
              "fully masked source row": FLOAT64_ATOL, "3 Adam steps float64": LOSSES_ATOL}
    for check, (_, largest) in checked.items():
        kind = next((kind for kind in nudges if check.startswith(kind)), None)
        if kind is not None:
            # printed to 2 significant digits
            assert float(largest) == pytest.approx(fraction * nudges[kind], rel=0.05), (check, largest)
