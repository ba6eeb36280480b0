"""``python compare.py``: every variant side by side on the same work, in one run.

For each block (device x dtype x shape), one table of at most 120 characters with a row per
variant: parameters; forward, train-step and greedy-decoding speed, each against the ``torch``
row; the train step's share of the matmul peak and its peak memory; the largest log-probability
difference from ``torch``. ``--wide`` shows every column; ``--all-decoders`` also times greedy
decoding by full recompute and beam 4; json and csv hold everything; ``--plot FILE.png`` draws
the times.

    python compare.py                                   # small preset, CPU, float32 (about a minute)
    python compare.py --preset base --batch 8 2 --src-len 128 512
    python compare.py --dtype float32 bfloat16 --format json --output run.json
    python compare.py --preset base --plot compare.png
    python compare.py --processes 3                     # pooled over three fresh interpreters

This file is the command line only: options -> ``benchmarks.settings.Settings`` ->
``benchmarks.run.run`` -> ``benchmarks.render.render``. The method is in ``benchmarks/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from benchmarks.machine import WAIT_POLICIES, settle_threads, wait_policy_environment

# before torch loads its OpenMP runtime, which reads the wait policy once, when it loads: no
# import above this line may import torch (tests/benchmarks/test_busy_cores.py checks the policy)
os.environ.update(wait_policy_environment(sys.argv[1:], os.environ))

import torch
from tqdm import tqdm

from benchmarks.engines import ENGINES, row_argument
from benchmarks.plot import plot
from benchmarks.processes import run_processes
from benchmarks.render import FORMATS, render, warning_lines, write_table
from benchmarks.run import run
from benchmarks.settings import MIN_RUN_TIME, ROUNDS, Settings, settings_from_options
from benchmarks.workload import DTYPES, PRESETS
from common.cli import Parser, device_or_exit, positive
from variants import VARIANTS


def command_line() -> Parser:
    parser = Parser(prog="compare.py", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default="cpu",
                        help="where to run; 'all' = cpu, and cuda when present (default cpu)")
    parser.add_argument("--preset", choices=tuple(PRESETS), default="small",
                        help="model size; base = the paper's 512/8/6/2048/37000, paper-base and "
                             "paper-big = its Table 3 models, embeddings shared (default small)")
    parser.add_argument("--batch", type=positive(int), nargs="+",
                        help="batch size(s), paired with the lengths (default: the preset's)")
    parser.add_argument("--src-len", type=positive(int), nargs="+", help="source length(s)")
    parser.add_argument("--tgt-len", type=positive(int), nargs="+",
                        help="target length(s) (default: the source lengths)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), nargs="+", default=["float32"],
                        help="one block per dtype; the model is cast to it (default float32)")
    parser.add_argument("--autocast", action="store_true",
                        help="keep float32 weights and run under torch.autocast(dtype) instead")
    parser.add_argument("--dropout", type=float, help="dropout (default: the config's 0.1)")
    parser.add_argument("--max-seq-len", type=positive(int), metavar="N",
                        help="longest length the model takes (default: the preset's); the "
                             "sinusoid table has no weights, so the model is otherwise the same")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile each model; compile time and the speed-up over eager "
                             "(timed in the same rounds) get their own columns")
    parser.add_argument("--freeze", action="store_true",
                        help="with --compile: inductor freezing for the eval forward (weights folded "
                             "in as constants; the CPU inference setting)")
    parser.add_argument("--variants", type=row_argument, nargs="+", default=list(VARIANTS),
                        metavar="ROW", help=f"{', '.join(VARIANTS)}, pkg.module:Class, or a deployment "
                        f"engine timed decoding only: {', '.join(ENGINES)} (default: the variants; "
                        "a ×torch needs the torch row)")
    parser.add_argument("--threads", type=positive(int),
                        help=f"CPU threads (default {torch.get_num_threads()}, fewer when other "
                             "processes hold cores; given, it is kept, with a warning if they do)")
    parser.add_argument("--omp-wait-policy", choices=WAIT_POLICIES,
                        help="OpenMP threads between operators: spin (active) or sleep (passive); "
                             "set before torch loads (default: OMP_WAIT_POLICY, else OpenMP's)")
    parser.add_argument("--format", choices=FORMATS, default="github", metavar="FORMAT",
                        help="a tabulate style (github, grid, latex, ...), json or csv (default github)")
    parser.add_argument("--output", metavar="FILE", help="write the table here instead of stdout")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="also draw the times relative to torch as a PNG (needs the plot extra)")
    parser.add_argument("--rounds", type=positive(int), default=ROUNDS,
                        help="rounds, each timing every row once in a fresh shuffled order; ratios "
                             f"are paired by round, with 95%% intervals over them (default {ROUNDS})")
    parser.add_argument("--min-run-time", type=positive(float), default=MIN_RUN_TIME, metavar="SECONDS",
                        help="seconds of a cell's block of calls in a round, at least one call "
                             f"(default {MIN_RUN_TIME})")
    parser.add_argument("--no-control", action="store_true",
                        help="do not time torch a second time as the control (torch against itself, "
                             "the run's resolution; on by default)")
    parser.add_argument("--processes", type=positive(int), default=1, metavar="N",
                        help="repeat the measurement in N fresh interpreters and pool their rounds; "
                             "intervals then resample processes, then rounds (default 1)")
    parser.add_argument("--decode-len", type=positive(int), default=16, metavar="L",
                        help="greedy-decoding length incl. BOS for the decode column; 1 skips it "
                             "(default 16)")
    parser.add_argument("--wide", action="store_true",
                        help="show every column (the default table is the compact one)")
    parser.add_argument("--all-decoders", action="store_true",
                        help="beside cached greedy decoding, also time greedy decoding by full "
                             "recompute and beam-4 search (their columns are in --wide and json/csv)")
    parser.add_argument("--no-torch-fast-path", action="store_true",
                        help="turn off nn.Transformer's fused eval kernels (torch.backends.mha)")
    parser.add_argument("--malloc", choices=("keep", "default"), default="keep",
                        help="keep: glibc keeps freed memory (see keep_freed_memory); default: leave it")
    parser.add_argument("--seed", type=int, default=0, help="weights and batch seed (default 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
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
        report = run(settings) if args.processes == 1 else run_processes(settings, args.processes)
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
