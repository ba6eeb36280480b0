"""A drafted map run before anyone trusts it (``--suggest-maps``): the reference's seeded weights
loaded through the draft (``variants.check.suggest``), both models compared point by point in
float64 (``variants.check.divergence``).

The draft reads modules, names, registration order and the order a forward pass calls them;
none of it tells two same-shaped linears apart when their names say nothing and the model calls
them in an order that misleads. Running it does: where the draft's forward diverges at a point,
each exchange a wrong map makes there (``variants.check.combined.exchanges``: another norm's
module, W_q and W_k, a decoder layer's self- and cross-attention) is tried on the map, weights
and probes together; one that makes the point agree (the first divergence moves on or goes) is
kept, and the run goes on from there. The verdict says which:

- verified: the draft agrees with the reference at every point (within the reference's own
  float32 rounding where float32 is on the model's path);
- corrected: the draft as read diverged, the exchanges named made it agree; the entries they
  changed are marked in the map printed;
- unverified: the draft diverges at a point no exchange fixes (a wrong entry the draft cannot
  correct, or a model that departs from the reference there: the check says which), or could
  not be run at all.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
from torch import nn

from common.cli import error_line
from common.config import TransformerConfig
from common.random_batch import random_batch
from common.weights import import_weights
from variants import REFERENCE, build
from variants.check.adapter import interfaced
from variants.check.combined import exchanged, exchanges
from variants.check.diagnose import stand_ins
from variants.check.divergence import PointDifference, compare_points, number
from variants.check.explain import kind_of
from variants.check.harness import battery_weights, held_at_zero
from variants.check.patterns import Draft, complete
from variants.check.tolerances import FLOAT64

FAMILY_WORDS = {"norms": "the two norms' modules", "self/cross": "the self-attention and the cross-attention",
                "W_q/W_k": "W_q and W_k (the queries' and the keys' linear)"}
TRIED = "another norm's module, W_q/W_k, a decoder layer's self-/cross-attention"


def run_draft(cls: type[nn.Module], found: Draft, config: TransformerConfig, seed: int = 0,
              ) -> list[PointDifference]:
    """``cls`` built with ``found``'s maps and the reference, both holding ``seed``'s battery
    weights, compared at every point in float64 (the reference's own float32 rounding measured)."""
    drafted = type(cls.__name__, (cls,), {
        "__module__": cls.__module__, "__qualname__": cls.__qualname__, "stack_names": None,
        "weight_map": dict(found.weights), "probe_map": dict(found.probes),
        "extra_parameters": (*getattr(cls, "extra_parameters", ()), *found.unplaced)})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # parameters outside the canonical set: the same draw every run
        subject = interfaced(drafted)(config)
    reference = build(REFERENCE, config)
    state = battery_weights(config, seed)
    for absent in held_at_zero(subject):
        state[absent] = torch.zeros_like(state[absent])
    for model in (subject, reference):
        import_weights(model, state)
        model.eval()
    low = copy.deepcopy(reference)
    subject, reference = subject.double(), reference.double()
    return compare_points(subject, reference, random_batch(config, 3, 7, 5, seed=seed).inputs(),
                          names=(cls.__name__, REFERENCE), b_float32=low,
                          stand_ins=(stand_ins(subject), stand_ins(reference)))


def first_index(differences: list[PointDifference]) -> int | None:
    return next((k for k, d in enumerate(differences) if d.diverges(FLOAT64.atol)), None)


def verified(cls: type[nn.Module], found: Draft, config: TransformerConfig, seed: int = 0) -> Draft:
    """``found`` with its verdict (``Draft.verdict``), corrected where exchanges made it agree
    (``Draft.corrected``); see the module docstring. Never raises: a draft that cannot be run is
    unverified, and says why."""
    missing = complete(found, config)
    if missing:
        return replace(found, verdict=f"unverified: not run, the draft leaves {missing[0]} out (TODO below)")
    try:
        return _search(cls, found, config, seed)
    except Exception as error:  # the model's own error, or maps the adapter refuses: say so, go on
        return replace(found, verdict=f"unverified: the draft could not be run: {error_line(error)}")


def _search(cls: type[nn.Module], found: Draft, config: TransformerConfig, seed: int) -> Draft:
    differences = run_draft(cls, found, config, seed)
    at = first_index(differences)
    diverged = differences[at] if at is not None else None
    done: list[tuple[str, str, str]] = []
    while at is not None and len(done) < 4 * len(differences):
        point, best = differences[at].point, None
        for family, slot, other in exchanges(kind_of(point) or "", point, found.weights):
            trial = replace(found, weights=exchanged(found.weights, slot, other),
                            probes=exchanged(found.probes, slot, other))
            tried = run_draft(cls, trial, config, seed)
            moved = first_index(tried)
            if moved is None or (moved > at and (best is None or moved > best[-1])):
                best = ((family, slot, other), trial, tried, moved)
            if moved is None:
                break
        if best is None:
            break
        exchange, found, differences, at = best
        done.append(exchange)
    return replace(found, verdict=_verdict(differences, at, diverged, done),
                   corrected={**found.corrected, **_marks(found, done)})


def _marks(found: Draft, done: list[tuple[str, str, str]]) -> dict[str, str]:
    """Each entry an exchange changed -> what it was exchanged with (the slot's own name, after
    what the two share: wk, norm2)."""
    marks = {}
    for _family, slot, other in done:
        words = list(zip(slot.split("."), other.split("."), strict=False))
        shared = next((k for k, (a, b) in enumerate(words) if a != b), len(words))
        for name in (*found.weights, *found.probes):
            for mine, theirs in ((slot, other), (other, slot)):
                if name == mine or name.startswith(mine + "."):
                    marks[name] = f"corrected: exchanged with {'.'.join(theirs.split('.')[shared:])}"
    return marks


def _place(family: str, slot: str, other: str) -> str:
    """Where an exchange was made: the two norms, the attention (W_q/W_k), the layer (self/cross)."""
    return f"{slot} and {other}" if family == "norms" else slot.rpartition(".")[0]


def _verdict(differences: list[PointDifference], at: int | None, diverged: PointDifference | None,
             done: list[tuple[str, str, str]]) -> str:
    places: dict[str, list[str]] = {}
    for family, slot, other in done:
        places.setdefault(family, []).append(_place(family, slot, other))
    what = "; ".join(f"{FAMILY_WORDS[family]} exchanged in {', '.join(where)}"
                     for family, where in places.items())
    if diverged is None:
        worst = max((d.max_abs for d in differences if d.max_abs is not None), default=0.0)
        rounded = any(d.departs(FLOAT64.atol) for d in differences)
        unprobed = ", ".join(d.point for d in differences if d.max_abs is None)
        where = f"every point it probes (not {unprobed})" if unprobed else "every point"
        return (f"verified: the reference's seeded weights, loaded through this map, give the reference's "
                f"values at {where} in float64 (largest |Δ| {number(worst)}"
                + (", within the reference's own float32 rounding)" if rounded else ")"))
    if at is None:
        return (f"corrected: as drafted, the forward diverged at {diverged.point} (max |Δ| "
                f"{number(diverged.max_abs)}); with {what}, it agrees with the reference at every point: the "
                f"entries marked below are corrected")
    still = differences[at]
    return (f"unverified: the draft diverges at {still.point} (max |Δ| {number(still.max_abs)})"
            + (f" even with {what} (marked below)" if done else "")
            + f"; no exchange of same-shaped parameters there ({TRIED}) makes it agree: a wrong entry the "
              f"draft cannot correct, or the model departs from the reference there (the check without "
              f"--suggest-maps says which)")
