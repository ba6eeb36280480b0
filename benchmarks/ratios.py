"""Ratios between rows from paired rounds, each with a 95% bootstrap interval.

    ratio = paired_ratio(explicit_rounds, torch_rounds)   # each round's seconds, in round order
    print(ratio.value, ratio.low, ratio.high)              # e.g. 1.12 [1.09, 1.15]

Every round times every row once, one after another (``benchmarks.run``), so a round's ratio
row / torch compares two times taken seconds apart: whatever slowed the machine in that round
slowed both. A row's ×torch is the geometric mean of its rounds' ratios, the mean of their
logarithms: the statistic of a ratio, since it treats 1.1x slower and 1.1x faster alike and
gives torch / row as the inverse of row / torch. The interval is scipy's BCa bootstrap over
the rounds (``scipy.stats.bootstrap``), seeded so that a report repeats.

Rounds from several fresh processes (``compare.py --processes N``) carry a process index; their
interval resamples processes, then rounds within each (a two-level percentile bootstrap, which
scipy does not offer): a process's memory layout and thread placement stay fixed through its
rounds, so rounds of one process are not independent of each other.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95  # every interval's level
RESAMPLES = 2000  # bootstrap resamples per interval: a few milliseconds each


@dataclass(frozen=True)
class Ratio:
    """A paired ratio: its geometric mean over rounds and its interval (None with one round)."""

    value: float  # geometric mean of the rounds' ratios
    low: float | None  # the interval's bounds; None where one round gives nothing to resample
    high: float | None
    rounds: int  # how many paired rounds it stands on

    def holds(self, x: float) -> bool:
        """Whether ``x`` lies inside the interval (bounds included)."""
        return self.low is not None and self.low <= x <= self.high

    def as_dict(self, key: str) -> dict[str, float | None]:
        """``{key: value, key_low: low, key_high: high}``, the report's form."""
        return {key: self.value, f"{key}_low": self.low, f"{key}_high": self.high}


def paired_ratio(numerators: Sequence[float], denominators: Sequence[float], *,
                 processes: Sequence[int] | None = None, seed: int = 0) -> Ratio | None:
    """The geometric mean of ``numerators[i] / denominators[i]`` with its interval, pairing the
    first rounds both have; ``processes[i]`` is round i's process (None: all one process).
    None when no round pairs or a time is not positive."""
    pairs = min(len(numerators), len(denominators))
    if pairs == 0:
        return None
    top, bottom = np.asarray(numerators[:pairs], float), np.asarray(denominators[:pairs], float)
    if not (np.all(top > 0) and np.all(bottom > 0)):
        return None
    logs = np.log(top) - np.log(bottom)
    value = math.exp(logs.mean())
    groups = np.zeros(pairs, int) if processes is None else np.asarray(processes[:pairs])
    if pairs == 1:
        return Ratio(value, None, None, 1)
    if np.ptp(logs) == 0.0:  # every round the same: no spread to resample (BCa is undefined)
        return Ratio(value, value, value, pairs)
    if len(np.unique(groups)) > 1:
        low, high = two_level_interval(logs, groups, seed)
    else:
        low, high = bca_interval(logs, seed)
    return Ratio(value, math.exp(low), math.exp(high), pairs)


def bca_interval(logs: np.ndarray, seed: int) -> tuple[float, float]:
    """scipy's BCa interval of the mean of ``logs``."""
    with warnings.catch_warnings():  # a near-degenerate sample: scipy warns and returns nan
        warnings.simplefilter("ignore")
        found = stats.bootstrap((logs,), np.mean, confidence_level=CONFIDENCE, method="BCa",
                                n_resamples=RESAMPLES, random_state=np.random.default_rng(seed))
    low, high = found.confidence_interval
    if not (math.isfinite(low) and math.isfinite(high)):
        return percentile_interval(resampled_means(logs, seed))
    return float(low), float(high)


def two_level_interval(logs: np.ndarray, groups: np.ndarray, seed: int) -> tuple[float, float]:
    """Percentile interval of the mean of ``logs`` resampling groups (processes), then the
    rounds inside each chosen group, ``RESAMPLES`` times."""
    rng = np.random.default_rng(seed)
    members = [logs[groups == group] for group in np.unique(groups)]
    means = np.empty(RESAMPLES)
    for index in range(RESAMPLES):
        chosen = rng.integers(len(members), size=len(members))
        drawn = [rng.choice(members[g], size=len(members[g])) for g in chosen]
        means[index] = np.concatenate(drawn).mean()
    return percentile_interval(means)


def resampled_means(logs: np.ndarray, seed: int) -> np.ndarray:
    """Means of ``RESAMPLES`` resamples of ``logs`` with replacement."""
    rng = np.random.default_rng(seed)
    return rng.choice(logs, size=(RESAMPLES, len(logs))).mean(axis=1)


def percentile_interval(means: np.ndarray) -> tuple[float, float]:
    """The central ``CONFIDENCE`` share of bootstrap ``means``."""
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def round_orders(names: Sequence[str], rounds: int, seed: int) -> list[list[str]]:
    """The order in which each round times the rows: a fresh shuffle per round, from ``seed``
    alone, so that a report's recorded orders can be drawn again."""
    rng = np.random.default_rng(seed)
    return [[names[i] for i in rng.permutation(len(names))] for _ in range(rounds)]
