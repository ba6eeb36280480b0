"""Ratios between rows from paired rounds, each with a 95% bootstrap interval.

    ratio = paired_ratio(explicit_rounds, torch_rounds)   # each round's seconds, in round order
    print(ratio.value, ratio.low, ratio.high)              # e.g. 1.12 [1.09, 1.15]

Every round times every row once, one after another (``benchmarks.compare.run``), so a round's ratio
row / torch compares two times taken seconds apart: whatever slowed the machine in that round
slowed both. A row's ×torch is the median of its rounds' ratios, taken on their logarithms so
that 1.1x slower and 1.1x faster weigh alike and torch / row is the inverse of row / torch. A
median, not a mean: a round that another program disturbed can read 1.3x or 1.6x, and one such
round moves the mean of twelve by 2-4%, as much as the spread of all the others (the coverage
study, docs/results/cpu-small-coverage.md); the rows' ms columns are medians over rounds too.

Rounds from several fresh processes (``compare.py --processes N``) carry a process index; they
pair within their process (its k-th round of a row with its k-th round of torch), and the ratio
is the geometric mean of the processes' medians, each process weighing alike. A process's
thread placement and allocator state stay fixed through its rounds (where its weights lie does
not: ``benchmarks.compare.placement`` re-places them every round), so rounds of one process are not
independent of each other: the interval resamples processes, then rounds within each (a
two-level percentile bootstrap, which scipy does not offer), and the statistic again on each
resample. One process is the same bootstrap with one level.

Last, which ratios a compare.py table prints (``TABLE_RATIOS``: decoding against ``fused``'s
cached decoding, since torch has no cache) and how far each is resolved (``ratio_widths``, the
relative half-width of its interval), which ``--resolution`` and the table's resolution line read.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from common.checks import check_int, check_seed
from variants import REFERENCE

CONFIDENCE = 0.95  # every interval's level
RESAMPLES = 2000  # bootstrap resamples per interval: a few milliseconds each


@dataclass(frozen=True)
class Ratio:
    """A paired ratio: its median over rounds and its interval (None with one round)."""

    value: float  # the rounds' median ratio (several processes: the geometric mean of their medians)
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
                 processes: Sequence[int] | None = None,
                 denominator_processes: Sequence[int] | None = None, seed: int = 0) -> Ratio | None:
    """The median of ``numerators[i] / denominators[i]`` with its interval (several processes:
    the geometric mean of each process's median).

    Rounds pair by their place: the first rounds both lists have (round i with round i), and
    with several processes within each process, its first rounds with the same process's first
    rounds, never another process's. ``processes[i]`` is numerator round i's process and
    ``denominator_processes[j]`` denominator round j's (default: ``processes``), one label a
    round (None: all one process).

    None when no round pairs, or when a paired time is not a positive, finite number (zero,
    negative, NaN or infinite: a failed or spoilt measurement, no ratio to stand on). TypeError
    names a list that is not of numbers; ValueError a list of labels of the wrong length.
    """
    top, bottom = times("numerators", numerators), times("denominators", denominators)
    check_seed("seed", seed)
    if denominator_processes is None:
        denominator_processes = processes
    top_groups = labels("processes", processes, len(top))
    bottom_groups = labels("denominator_processes", denominator_processes, len(bottom))
    pairs = [(top[i], bottom[j], group) for i, j, group in pair_rounds(top_groups, bottom_groups)]
    if not pairs:
        return None
    paired_top, paired_bottom, groups = (np.asarray(column) for column in zip(*pairs, strict=True))
    if not (np.all(np.isfinite(paired_top)) and np.all(np.isfinite(paired_bottom))
            and np.all(paired_top > 0) and np.all(paired_bottom > 0)):
        return None
    logs = np.log(paired_top) - np.log(paired_bottom)
    value = math.exp(center(logs, groups))
    if len(logs) == 1:
        return Ratio(value, None, None, 1)
    if np.ptp(logs) == 0.0:  # every round the same: nothing to resample
        return Ratio(value, value, value, len(logs))
    low, high = two_level_interval(logs, groups, seed)
    return Ratio(value, math.exp(low), math.exp(high), len(logs))


def center(logs: np.ndarray, groups: np.ndarray) -> float:
    """The statistic: the mean over processes of each process's median log-ratio."""
    return float(np.mean([np.median(logs[groups == group]) for group in np.unique(groups)]))


def times(name: str, values: object) -> list[float]:
    """``values`` as a list of floats: a sequence of numbers (not a string, not bools), else
    TypeError naming ``name``."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
        raise TypeError(f"paired_ratio's {name} must be a sequence of times in seconds, "
                        f"got {type(values).__name__} {values!r}")
    bad = next((value for value in values
                if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real)), None)
    if bad is not None:
        raise TypeError(f"paired_ratio's {name} must be times in seconds (numbers), "
                        f"got {type(bad).__name__} {bad!r}")
    return [float(value) for value in values]


def labels(name: str, values: Sequence[int] | None, rounds: int) -> list[int]:
    """Each round's process: ``values``, one a round (ValueError otherwise), or 0 for all."""
    if values is None:
        return [0] * rounds
    values = list(values)
    if len(values) != rounds:
        raise ValueError(f"paired_ratio's {name} must label each round: got {len(values)} labels "
                         f"for {rounds} rounds")
    return values


def pair_rounds(top_groups: list[int], bottom_groups: list[int]) -> list[tuple[int, int, int]]:
    """``(numerator index, denominator index, process)`` of every pair: in each process, its
    k-th numerator round with its k-th denominator round, as far as both go."""
    bottom_by_group: dict[int, list[int]] = {}
    for index, group in enumerate(bottom_groups):
        bottom_by_group.setdefault(group, []).append(index)
    seen: dict[int, int] = {}
    pairs = []
    for index, group in enumerate(top_groups):
        place = seen.get(group, 0)
        seen[group] = place + 1
        partners = bottom_by_group.get(group, [])
        if place < len(partners):
            pairs.append((index, partners[place], group))
    return pairs


def two_level_interval(logs: np.ndarray, groups: np.ndarray, seed: int) -> tuple[float, float]:
    """Percentile interval of ``center`` resampling groups (processes), then the rounds inside
    each chosen group, ``RESAMPLES`` times; with one group, a bootstrap of its rounds' median."""
    rng = np.random.default_rng(seed)
    members = [logs[groups == group] for group in np.unique(groups)]
    slots = len(members)
    # medians[g][r, s]: group g's rounds resampled for resample r's s-th draw of a group
    medians = np.stack([np.median(rng.choice(rounds, size=(RESAMPLES, slots, len(rounds))), axis=-1)
                        for rounds in members])  # (groups, RESAMPLES, slots)
    chosen = rng.integers(slots, size=(RESAMPLES, slots))
    statistics = medians[chosen, np.arange(RESAMPLES)[:, None], np.arange(slots)].mean(axis=1)
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(statistics, [tail, 100 - tail])
    return float(low), float(high)


def round_orders(names: Sequence[str], rounds: int, seed: int) -> list[list[str]]:
    """The order in which each round times the rows: a fresh shuffle per round, from ``seed``
    alone, so that a report's recorded orders can be drawn again (``each_round_order``'s, all
    at once)."""
    check_int("rounds", rounds, low=0)
    return list(each_round_order(names, rounds, seed))


def each_round_order(names: Sequence[str], rounds: int | None, seed: int) -> Iterator[list[str]]:
    """``round_orders``, one round at a time: a run draws each round's order as the round
    starts, so that ``--rounds 1000000000`` starts timing at once; ``rounds`` None draws without
    end (``--resolution`` stops when it is met), the same orders as far as they go. ValueError
    or TypeError for a count of rounds or a seed no run could use, before the first order is
    drawn."""
    if rounds is not None:
        check_int("rounds", rounds, low=0)
    check_seed("seed", seed)
    return draw_orders(list(names), rounds, np.random.default_rng(seed))


def draw_orders(names: list[str], rounds: int | None, rng: np.random.Generator) -> Iterator[list[str]]:
    """``rounds`` shuffles of ``names`` from ``rng`` (None: without end), drawn as they are
    asked for."""
    for _ in range(rounds) if rounds is not None else itertools.count():
        yield [names[i] for i in rng.permutation(len(names))]


# --- the ratios a compare.py table prints --------------------------------------------------------

# Cached decoding against a cached decoder, like with like: the reference has no key/value cache
# and recomputes every step, so each row's cached greedy decoding is compared with this row's
DECODE_BASELINE = "fused"
DECODE_VS_BASELINE = f"decode_vs_{DECODE_BASELINE}"
# the control's ratio that stands for a key's resolution (the control is torch's copy, so it has
# no cached decoding: its decode ratio, full recompute against full recompute, stands in)
CONTROL_KEY = {DECODE_VS_BASELINE: "decode_vs_torch"}
# the ratios the compact table prints, which --resolution resolves and the resolution line reads:
# the rows' (key: its title) and the control's
TABLE_RATIOS = {"forward_vs_torch": "fwd ×torch", "train_vs_torch": "train ×torch",
                DECODE_VS_BASELINE: f"decode ×{DECODE_BASELINE}"}
CONTROL_TABLE_RATIOS = {"forward_vs_torch": "fwd", "train_vs_torch": "train", "decode_vs_torch": "decode"}


def own_baseline(row: dict, key: str) -> bool:
    """Whether ``key`` is ``row``'s ratio to itself, 1 by definition: the reference's ×torch,
    the decode baseline's own decode ratio."""
    return row["variant"] == (DECODE_BASELINE if key == DECODE_VS_BASELINE else REFERENCE)


def ratio_widths(block: dict) -> dict[str, float | None]:
    """Each ratio the compact table prints (``TABLE_RATIOS``, a row's ratio to itself aside)
    and each of the control's, by its label ("explicit train ×torch", "torch control fwd"): the
    relative half-width of its 95% interval, the farther bound's distance from the value over
    the value (0.03: ±3%), or None without an interval (one round)."""
    control = block.get("control")
    found = [(row, key, f"{row['variant']} {title}") for row in block["rows"]
             for key, title in TABLE_RATIOS.items() if not own_baseline(row, key)]
    found += [(control, key, f"{control['variant']} {title}")
              for key, title in CONTROL_TABLE_RATIOS.items()] if control else []
    widths = {}
    for row, key, label in found:
        value, low, high = row.get(key), row.get(f"{key}_low"), row.get(f"{key}_high")
        if value is not None:
            widths[label] = None if low is None else max(high / value - 1, 1 - low / value)
    return widths
