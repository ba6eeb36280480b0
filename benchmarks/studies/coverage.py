"""How often a run's intervals hold the truth: several runs of one command against their pool.

    python -m benchmarks.studies.coverage runs/after-*.json            # each run against all runs pooled
    python -m benchmarks.studies.coverage runs/after-*.json --reference runs/processes.json
    python -m benchmarks.studies.coverage runs/after-*.json --recompute   # ratios made again from rounds

Each argument is one ``compare.py --format json`` report of the same settings, or a JSON list of
such reports (how docs/results keeps a study's runs in one file). The reference
value of each ratio is the pooled one (``benchmarks.compare.processes.pool``: every run's rounds,
paired within their run), or another report's (a many-process run, say). A run covers a ratio
when its 95% interval holds the reference; the control (torch against a copy of itself) covers
when its interval holds 1. The table gives, per ratio, how many runs covered and the widest
relative half-width any run printed; a coverage below 9 of 10 says the intervals leave out a
source of error that varies between runs. ``--recompute`` reads each run's ratios anew from its
rounds with the current statistic (``benchmarks.compare.ratios``), so that a study recorded before the
statistic changed reads as its runs would print today; without it, as they printed.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

from benchmarks.compare.processes import pool
from common.cli import Parser, first_line

MODES = ("forward", "train", "decode")
BASELINES = {"forward": "torch", "train": "torch", "decode": "fused"}  # as the table pairs them


@dataclass(frozen=True)
class Coverage:
    """One ratio over the runs: how many intervals held the reference, and their widths."""

    name: str  # "explicit fwd ×torch", "control train"
    reference: float
    covered: int
    runs: int
    widest: float  # the largest relative half-width, (high - low) / 2 / ratio
    misses: tuple[str, ...]  # the intervals that missed, as "0.98 [0.95, 1.01]"


def ratio_keys(row: dict, mode: str) -> tuple[str, str, str] | None:
    """The report keys of ``row``'s ratio for ``mode`` (value, low, high), or None if it has none."""
    key = f"{mode}_vs_{BASELINES[mode]}"
    if row.get(key) is None or row.get(f"{key}_low") is None:
        return None
    return key, f"{key}_low", f"{key}_high"


def ratios(report: dict) -> dict[str, tuple[float, float, float]]:
    """{name: (ratio, low, high)} for every ratio of the report's first block, the control's too."""
    block = report["blocks"][0]
    found = {}
    for row in block["rows"]:
        if row["variant"] == BASELINES["forward"]:
            continue
        for mode in MODES:
            keys = ratio_keys(row, mode)
            if keys and row["variant"] != BASELINES[mode]:
                found[f"{row['variant']} {mode} ×{BASELINES[mode]}"] = tuple(row[k] for k in keys)
    control = block.get("control") or {}
    for mode in ("forward", "train", "decode"):
        key = f"{mode}_vs_torch"
        if control.get(key) is not None and control.get(f"{key}_low") is not None:
            found[f"control {mode}"] = (control[key], control[f"{key}_low"], control[f"{key}_high"])
    return found


def coverage(runs: list[dict], reference: dict | None = None, recompute: bool = False) -> list[Coverage]:
    """Each ratio's coverage over ``runs``, against ``reference``'s ratios (default: the runs
    pooled); the control's against 1. ``recompute``: each run's ratios made again from its
    rounds (a report pooled alone) rather than read as printed."""
    if len(runs) < 2:
        raise ValueError(f"coverage needs at least two runs, got {len(runs)}")
    if recompute:
        runs = [pool([run]) for run in runs]
    truth = ratios(reference if reference is not None else pool(runs))
    per_run = [ratios(run) for run in runs]
    result = []
    for name, (value, _, _) in truth.items():
        target = 1.0 if name.startswith("control") else value
        held, widths, misses = 0, [], []
        for found in per_run:
            if name not in found:
                continue
            ratio, low, high = found[name]
            widths.append((high - low) / 2 / ratio)
            if low <= target <= high:
                held += 1
            else:
                misses.append(f"{ratio:.3f} [{low:.3f}, {high:.3f}]")
        result.append(Coverage(name, target, held, len(widths), max(widths), tuple(misses)))
    return result


def table(rows: list[Coverage]) -> str:
    lines = [(c.name, f"{c.reference:.3f}", f"{c.covered}/{c.runs}", f"±{100 * c.widest:.1f}%",
              "; ".join(c.misses) or "-") for c in rows]
    return tabulate(lines, ["ratio", "reference", "intervals holding it", "widest half-width",
                            "intervals that missed"], tablefmt="github", disable_numparse=True)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m benchmarks.studies.coverage", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="compare.py --format json reports")
    parser.add_argument("--reference", type=Path, help="a report whose ratios are the truth "
                                                       "(default: the runs pooled)")
    parser.add_argument("--recompute", action="store_true",
                        help="make each run's ratios again from its rounds with the current statistic")
    args = parser.parse_args(argv)
    try:
        runs = []
        for path in args.runs:
            found = json.loads(path.read_text(encoding="utf-8"))
            runs += found if isinstance(found, list) else [found]
        reference = json.loads(args.reference.read_text(encoding="utf-8")) if args.reference else None
        print(table(coverage(runs, reference, args.recompute)))
    except (OSError, ValueError, KeyError) as error:
        print(f"python -m benchmarks.studies.coverage: {first_line(error)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
