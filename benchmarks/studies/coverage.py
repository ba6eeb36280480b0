"""How often a run's intervals hold the truth: several runs of one command against their pool.

    python -m benchmarks.studies.coverage runs/after-*.json            # each run against all runs pooled
    python -m benchmarks.studies.coverage runs/after-*.json --reference runs/processes.json
    python -m benchmarks.studies.coverage runs/after-*.json --recompute   # ratios made again from rounds

Each argument is one ``compare.py --format json`` report of the same settings, or a JSON list of
such reports (how docs/results keeps a study's runs in one file). The reference
value of each ratio is the pooled one (``benchmarks.compare.processes.pool``: every run's rounds,
paired within their run), or another file's (a many-process run, say; a list there is pooled).
Every ratio read must be finite and positive, and every run must hold the same rows and ratios:
anything else is refused in one line naming the file and the ratio or rows. A run covers a ratio
when its 95% interval holds the reference; the control (torch against a copy of itself) covers
when its interval holds 1. The table gives, per ratio, how many runs covered and the widest
relative half-width any run printed; a coverage below 9 of 10 says the intervals leave out a
source of error that varies between runs. ``--recompute`` reads each run's ratios anew from its
rounds with the current statistic (``benchmarks.compare.ratios``), so that a study recorded before the
statistic changed reads as its runs would print today; without it, as they printed.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

from benchmarks.compare.processes import pool
from common.cli import Parser, first_line
from common.files import FileError, read_json

MODES = ("forward", "train", "decode")
BASELINES = {"forward": "torch", "train": "torch", "decode": "fused"}  # as the table pairs them
REPORT = "a compare.py --format json report or a list of them"


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
                name = f"{row['variant']} {mode} ×{BASELINES[mode]}"
                found[name] = checked_ratio(name, *(row.get(k) for k in keys))
    control = block.get("control") or {}
    for mode in ("forward", "train", "decode"):
        key = f"{mode}_vs_torch"
        if control.get(key) is not None and control.get(f"{key}_low") is not None:
            found[f"control {mode}"] = checked_ratio(f"control {mode}", control[key], control[f"{key}_low"],
                                                     control.get(f"{key}_high"))
    return found


def checked_ratio(name: str, *values: object) -> tuple[float, float, float]:
    """``(ratio, low, high)`` of the ratio ``name``, each a finite positive number; else a
    ValueError naming the ratio and the value (a ratio of 0 or -1, NaN or inf is no time ratio)."""
    for label, value in zip(("ratio", "interval's low end", "interval's high end"), values, strict=True):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ValueError(f"{name}: its {label} is {value!r}; a time ratio is a finite positive number")
    return tuple(float(value) for value in values)


def report_problem(report: object) -> str | None:
    """Why ``report`` is not a compare.py report this study can read (its first block's rows and
    the meta that pooling reads), or None."""
    if not isinstance(report, dict) or not isinstance(report.get("meta"), dict):
        return "is not a compare.py report (no 'meta' object)"
    blocks = report.get("blocks")
    if not isinstance(blocks, list) or not blocks or not isinstance(blocks[0], dict):
        return "is not a compare.py report (no 'blocks' list of blocks)"
    rows = blocks[0].get("rows")
    if not isinstance(rows, list) or not all(isinstance(row, dict) and isinstance(row.get("variant"), str)
                                             for row in rows):
        return "is not a compare.py report (its first block has no 'rows' list of variant rows)"
    return None


def read_runs(path: Path) -> list[dict]:
    """The reports in ``path`` (one, or a list of them), each checked to be one whose ratios are
    all finite and positive; a FileError naming the file (and the run's index in a list)."""
    found = read_json(path, (dict, list), REPORT)
    runs = found if isinstance(found, list) else [found]
    if not runs:
        raise FileError(path, f"holds an empty list, not {REPORT}")
    for index, run in enumerate(runs):
        where = f"run {index + 1} of its list " if isinstance(found, list) else ""
        if problem := report_problem(run):
            raise FileError(path, f"{where}{problem}")
        try:
            ratios(run)
        except ValueError as error:
            raise FileError(path, f"{where}{error}") from None
    return runs


def rows_of(report: dict) -> tuple[str, ...]:
    """The variants of the report's first block's rows, in their order."""
    return tuple(row["variant"] for row in report["blocks"][0]["rows"])


def check_same_rows(runs: list[dict], names: list[str], reference: dict | None, reference_name: str) -> None:
    """A ValueError naming the runs (and the rows or ratios) that differ from the first run's:
    runs of one command share their rows, and a reference has every ratio they have."""
    first_rows, first_ratios = rows_of(runs[0]), set(ratios(runs[0]))
    others = [(name, run) for name, run in zip(names, runs, strict=True)][1:]
    for name, run in others:
        if rows_of(run) != first_rows:
            raise ValueError(f"{name} has the rows {', '.join(rows_of(run))}, but {names[0]} has "
                             f"{', '.join(first_rows)}: give runs of the same settings")
    for name, run in [*others, *([(reference_name, reference)] if reference is not None else [])]:
        found = set(ratios(run))
        if found != first_ratios:
            lacks, extra = sorted(first_ratios - found), sorted(found - first_ratios)
            said = "; ".join(part for part in (lacks and f"lacks {', '.join(lacks)}",
                                               extra and f"has {', '.join(extra)} beyond them") if part)
            raise ValueError(f"{name} does not hold the ratios of {names[0]}: it {said}")


def coverage(runs: list[dict], reference: dict | None = None, recompute: bool = False,
             names: list[str] | None = None, reference_name: str = "the reference") -> list[Coverage]:
    """Each ratio's coverage over ``runs``, against ``reference``'s ratios (default: the runs
    pooled); the control's against 1, whatever the reference's control. ``recompute``: each
    run's ratios made again from its rounds (a report pooled alone) rather than read as printed.
    ``names`` say which run is which in a ValueError (default "run 1", "run 2", ...): runs must
    hold the same rows and ratios, each ratio finite and positive."""
    if len(runs) < 2:
        raise ValueError(f"coverage needs at least two runs, got {len(runs)}")
    names = names or [f"run {index + 1}" for index in range(len(runs))]
    check_same_rows(runs, names, reference, reference_name)
    if recompute:
        runs = [again_from_rounds(run, name) for run, name in zip(runs, names, strict=True)]
    truth = ratios(reference if reference is not None else pool(runs))
    per_run = [ratios(run) for run in runs]
    result = []
    for name, (value, _, _) in truth.items():
        target = 1.0 if name.startswith("control") else value
        held, widths, misses = 0, [], []
        for found in per_run:
            ratio, low, high = found[name]
            widths.append((high - low) / 2 / ratio)
            if low <= target <= high:
                held += 1
            else:
                misses.append(f"{ratio:.3f} [{low:.3f}, {high:.3f}]")
        result.append(Coverage(name, target, held, len(widths), max(widths), tuple(misses)))
    return result


def again_from_rounds(run: dict, name: str) -> dict:
    """``run`` with its ratios made again from its rounds; a ValueError naming it if its rounds
    are not there to read."""
    try:
        return pool([run])
    except (KeyError, TypeError, IndexError) as error:
        raise ValueError(f"{name}: its ratios cannot be made again from its rounds "
                         f"({type(error).__name__}: {first_line(error)})") from None


def table(rows: list[Coverage]) -> str:
    lines = [(c.name, f"{c.reference:.3f}", f"{c.covered}/{c.runs}", f"±{100 * c.widest:.1f}%",
              "; ".join(c.misses) or "-") for c in rows]
    return tabulate(lines, ["ratio", "reference", "intervals holding it", "widest half-width",
                            "intervals that missed"], tablefmt="github", disable_numparse=True)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m benchmarks.studies.coverage", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path,
                        help="compare.py --format json reports, or files holding a JSON list of them")
    parser.add_argument("--reference", type=Path, help="a report whose ratios are the truth, or a list of "
                                                       "reports, pooled (default: the runs pooled)")
    parser.add_argument("--recompute", action="store_true",
                        help="make each run's ratios again from its rounds with the current statistic")
    args = parser.parse_args(argv)
    try:
        runs, names = [], []
        for path in args.runs:
            found = read_runs(path)
            runs += found
            names += [str(path)] if len(found) == 1 else [f"{path} (run {i + 1})" for i in range(len(found))]
        reference = None
        if args.reference:
            given = read_runs(args.reference)
            reference = given[0] if len(given) == 1 else pooled(given, args.reference)
        print(table(coverage(runs, reference, args.recompute, names, f"--reference {args.reference}")))
    except (ValueError, KeyError) as error:
        print(f"python -m benchmarks.studies.coverage: error: {first_line(error)}", file=sys.stderr)
        return 1
    return 0


def pooled(runs: list[dict], path: Path) -> dict:
    """The runs of one file pooled into one report; a FileError if they cannot be."""
    try:
        return pool(runs)
    except (ValueError, KeyError, TypeError, IndexError) as error:
        raise FileError(path, f"its runs cannot be pooled ({type(error).__name__}: "
                              f"{first_line(error)})") from None


if __name__ == "__main__":
    sys.exit(main())
