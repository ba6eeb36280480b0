"""``python compare.py``: every variant side by side on the same work, in one run.

For each block (device x dtype x shape), one table of at most 120 characters with a row per
variant: forward and train-step speed against the ``torch`` row, cached greedy decoding against
``fused``'s (torch has no cache), each a ratio paired by round with its 95% interval; the train
step's peak memory; the largest log-probability difference from ``torch``. Under it the control
(torch against a copy of itself) and how far the run resolved its ratios. Every row's weights
are re-placed in fresh memory before each round, so that where they lie varies inside the
intervals. ``--wide`` shows every column; ``--all-decoders`` also times greedy decoding by full
recompute and beam 4; json and csv hold everything; ``--plot FILE.png`` draws the times.

    python compare.py                                   # small preset, CPU, float32 (about 70 s)
    python compare.py --preset base --batch 8 2 --src-len 128 512
    python compare.py --dtype float32 bfloat16 --format json --output run.json
    python compare.py --preset base --plot compare.png
    python compare.py --processes 1                     # one interpreter, 10 rounds (about 50 s)
    python compare.py --resolution 0.03                 # 1 process, rounds added until every ratio's
                                                        # 95% interval is within ±3% (default:
                                                        # 4 processes x 3 rounds on the CPU)

This file is the command line only: options (``benchmarks.compare.settings.add_options``) -> ``Settings`` ->
``benchmarks.compare.run.run`` -> ``benchmarks.compare.render.render``. The method is in ``benchmarks/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from benchmarks.compare.machine import settle_threads, wait_policy_environment

# before torch loads its OpenMP runtime, which reads the wait policy once, when it loads: no
# import above this line may import torch (tests/benchmarks/compare/test_busy_cores.py checks the policy)
os.environ.update(wait_policy_environment(sys.argv[1:], os.environ))

import torch
from tqdm import tqdm

from benchmarks.compare.plot import plot
from benchmarks.compare.processes import run_processes
from benchmarks.compare.render import render, warning_lines, write_table
from benchmarks.compare.run import run
from benchmarks.compare.settings import Settings, add_options, settings_from_options
from common.cli import Parser, device_or_exit


def command_line() -> Parser:
    parser = Parser(prog="compare.py", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(parser)
    return parser


def parse_args(argv: list[str] | None = None) -> tuple[Settings, argparse.Namespace]:
    """The run's settings, and the options that say where its table goes (format, output,
    quiet). A bad option is a one-line usage error (exit status 2)."""
    parser = command_line()
    args = parser.parse_args(argv)
    if args.device == "cuda":
        device_or_exit(parser, args.device)
    command = " ".join(["compare.py", *(sys.argv[1:] if argv is None else argv)])
    try:
        return settings_from_options(args, command, os.environ), args
    except ValueError as error:
        parser.error(str(error))


def main(argv: list[str] | None = None) -> int:
    settings, args = parse_args(argv)
    choice = settle_threads(args.threads, torch.get_num_threads())
    if choice.line and (choice.busy or not args.quiet):
        tqdm.write(f"compare.py: {choice.line}", file=sys.stderr)
    settings = dataclasses.replace(settings, threads=choice.threads, thread_choice=choice)
    try:
        report = run(settings) if settings.processes == 1 else run_processes(settings)
    except RuntimeError as error:  # a fresh process that failed: its last line
        sys.exit(f"compare.py: error: {error}")
    text = render(report, args.format, wide=args.wide)
    if problem := write_table(text, args.output):
        sys.exit(f"compare.py: error: {problem}")
    if args.output or args.format in ("json", "csv"):  # not at the top of a table here
        for warning in warning_lines(report):
            tqdm.write(f"compare.py: {warning}", file=sys.stderr)
    if args.plot:
        plot(report, args.plot)
    for written in (args.output, args.plot):
        if written and not args.quiet:
            tqdm.write(f"wrote {written}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
