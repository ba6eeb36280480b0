"""``Settings``: everything one run is asked to do, fixed before it starts."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from benchmarks.compare.machine import WAIT_POLICIES, ThreadChoice, wait_policy_problem
from benchmarks.compare.plot import matplotlib_problem, path_problem
from benchmarks.compare.render import FORMATS
from benchmarks.compare.workload import DTYPES, TIMING_PRESETS, Shape, check_lengths, paired_shapes
from benchmarks.engines.rows import ENGINES, engines_problem, row_argument
from common.checks import check_int, check_number, check_seed
from common.cli import positive, seed_int
from common.config import TransformerConfig
from variants import VARIANTS, ordered

# Many short rounds rather than a few long ones: a burst of other work then spoils one round's
# ratios, which the interval over rounds shows, instead of one row's whole time.
ROUNDS = 10
MIN_RUN_TIME = 0.05
# A CPU run's default: its rounds spread over this many fresh interpreters, this many rounds each.
# Where a process's threads and allocator settle holds for all its rounds, so only rounds from
# several processes put that spread inside the intervals (docs/results/cpu-small-coverage.md).
# Four of three rather than three of four: in ten runs of each, the decode intervals of three
# processes missed the pooled value 4 times (the control's once), four's never, for 7 s more a
# run (docs/results/cpu-small-default-cost.md)
PROCESSES = 4
ROUNDS_PER_PROCESS = 3
# --resolution's cap on the whole run's seconds: rounds are added until each ratio is resolved
# to the fraction asked, or until this
MAX_SECONDS = 600.0


@dataclass(frozen=True)
class Settings:
    """What ``benchmarks.compare.run.run`` measures and how. One block per (device, dtype, shape)."""

    config: TransformerConfig  # the model every row builds
    shapes: tuple[Shape, ...]  # the batch shapes, one block each
    preset: str = "custom"  # the name the header gives the model size
    devices: tuple[str, ...] = ("cpu",)  # "cpu" and/or "cuda"
    dtypes: tuple[str, ...] = ("float32",)  # names in workload.DTYPES; the model is cast to each
    variants: tuple[str, ...] = VARIANTS  # the timed rows; the reference is built regardless
    engines: tuple[str, ...] = ()  # deployment engines timed as decode rows beside them
    # (benchmarks.engines.rows.ENGINES; CPU float32 blocks only, float32 and int8 rows each)
    autocast: bool = False  # keep float32 weights and run under torch.autocast(dtype) instead
    compile: bool = False  # torch.compile each model and time its eager steps alongside
    freeze: bool = False  # with compile: inductor freezing for the eval forward
    threads: int = field(default_factory=torch.get_num_threads)  # CPU threads, set for the run
    thread_choice: ThreadChoice | None = None  # how `threads` was chosen and how busy the cores
    # were before the run (benchmarks.compare.machine.settle_threads); None: not checked
    rounds: int = ROUNDS  # rounds (with resolution: the least; with processes: each process's);
    # each times every row once, in a fresh shuffled order
    processes: int = 1  # fresh interpreters that repeat the rounds, pooled (benchmarks.compare.processes)
    min_run_time: float = MIN_RUN_TIME  # seconds of a cell's block of calls a round (at least one)
    control: bool = True  # time a second, separately built torch row: the run's resolution
    order_seed: int = 0  # seeds the rounds' shuffled orders and the weights' re-placing (a
    # process of --processes N: its index)
    replace_weights: bool = True  # before every round, copy each row's weights to fresh memory
    # behind a random gap (benchmarks.compare.placement), so that where they lie varies inside the
    # intervals; not with compile (the compiled graphs hold the weights)
    resolution: float | None = None  # a fraction below 1: with it, rounds past `rounds` (then the
    # least) until every ratio's 95% interval is within ±resolution of it (0.03: ±3%), or until
    # max_seconds; one process only
    max_seconds: float = MAX_SECONDS  # with resolution: no round starts once the run is this old
    decode_len: int = 16  # greedy-decoding length counting BOS; 1 skips the decode column
    all_decoders: bool = False  # also greedy by full recompute and beam 4 (compare.py --all-decoders)
    seed: int = 0  # the weights' and the batch's seed
    measure_shared: bool = True  # what a pooled report keeps of the first process alone: each
    # step's peak memory and each cache's bytes (the same in every process), the log-prob check
    # (deterministic) and the matmul peak; a run spread over processes measures them in its first
    keep_freed_memory: bool = True  # tell glibc to keep freed memory (memory.keep_freed_memory)
    torch_fast_path: bool = True  # let nn.Transformer use its fused eval kernels
    show_progress: bool = True  # a progress bar on stderr
    command: str = ""  # how the run was asked for, recorded in the report

    def __post_init__(self) -> None:
        """The numbers a run would otherwise trip on only after timing: its seeds (the intervals'
        resampling is seeded too; ``common.checks.check_seed``), its rounds and processes, the
        resolution asked (a fraction below 1, in one process), the time cap, and the one switch a
        truthy string would silently turn on. compare.py reports these as usage errors, each
        field named by its option (``OPTIONS``): this is their one check."""
        check_seed("Settings.seed", self.seed)
        check_seed("Settings.order_seed", self.order_seed)
        check_int("Settings.rounds", self.rounds, low=1)
        check_int("Settings.processes", self.processes, low=1)
        if self.resolution is not None and self.processes > 1:
            raise ValueError("Settings.resolution adds rounds in one process; with Settings.processes > 1 "
                             "give Settings.rounds instead")
        if self.resolution is not None:
            check_number("Settings.resolution", self.resolution, high=1.0)
        check_number("Settings.max_seconds", self.max_seconds)
        if not isinstance(self.replace_weights, bool):
            raise TypeError(f"Settings.replace_weights must be True or False, got "
                            f"{type(self.replace_weights).__name__} {self.replace_weights!r}")

    @property
    def replacing(self) -> bool:
        """Whether the run re-places the rows' weights before each round: asked for, and no
        compiled graph holds them."""
        return self.replace_weights and not self.compile

    @property
    def modes(self) -> tuple[str, ...]:
        """The steps timed for every row, in the order each round runs them."""
        decoders = ("decode", "decode_uncached", "beam") if self.all_decoders else ("decode",)
        modes = ("forward", "train") + (decoders if self.decode_len > 1 else ())
        # with compile, the eager steps too, timed in the same rounds: the speed-up columns
        return modes + (("forward_eager", "train_eager") if self.compile else ())


def add_options(parser: argparse.ArgumentParser) -> None:
    """compare.py's options, each with its help; ``settings_from_options`` turns them into
    ``Settings``."""
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default="cpu",
                        help="where to run; 'all' = cpu, and cuda when present (default cpu)")
    parser.add_argument("--preset", choices=tuple(TIMING_PRESETS), default="small",
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
    parser.add_argument("--rounds", type=positive(int),
                        help="rounds (a process's, with several), each timing every row once in a fresh "
                             "shuffled order; ratios are paired by round, with 95%% intervals over them "
                             f"(default {ROUNDS} in one process, {ROUNDS_PER_PROCESS} each in several; "
                             "with --resolution, the least)")
    parser.add_argument("--min-run-time", type=positive(float), default=MIN_RUN_TIME, metavar="SECONDS",
                        help="seconds of a cell's block of calls in a round, at least one call "
                             f"(default {MIN_RUN_TIME})")
    parser.add_argument("--no-control", action="store_true",
                        help="do not time torch a second time as the control (torch against itself, "
                             "the run's resolution; on by default)")
    parser.add_argument("--resolution", type=float, metavar="FRACTION",
                        help="rounds until every ratio's 95%% interval is within ±FRACTION of it "
                             "(0.03: ±3%%), a fraction below 1: the run is then 1 process, not the "
                             f"default {PROCESSES} processes x {ROUNDS_PER_PROCESS} rounds on the CPU, "
                             f"and adds rounds, one at a time, past --rounds (then the least, default "
                             f"{ROUNDS}) until then or --max-seconds; the table says which fell short")
    parser.add_argument("--max-seconds", type=float, metavar="SECONDS",
                        help="with --resolution: start no round once the run is this old "
                             f"(default {MAX_SECONDS:g})")
    parser.add_argument("--replace-weights", action=argparse.BooleanOptionalAction, default=True,
                        help="before every round, copy each row's weights to fresh memory behind a random "
                             "gap, so that where they lie varies inside the intervals (default on; "
                             "not with --compile)")
    parser.add_argument("--processes", type=positive(int), metavar="N",
                        help="repeat the measurement in N fresh interpreters and pool their rounds; "
                             f"intervals then resample processes, then rounds (default {PROCESSES} on "
                             "the CPU alone without --rounds, --resolution or --compile, else 1)")
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
    parser.add_argument("--seed", type=seed_int, default=0,
                        help="weights and batch seed, 0..2**32-1 (default 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def settings_from_options(args: argparse.Namespace, command: str, environ: Mapping[str, str]) -> Settings:
    """compare.py's options as the run's ``Settings``, every value checked before any work:
    ValueError names the first that cannot run (the model's fields, lengths, engine rows, the
    wait policy, a table or picture that could not be written)."""
    preset = TIMING_PRESETS[args.preset]
    changed = {"dropout": args.dropout, "max_seq_len": args.max_seq_len}  # None: the preset's
    try:
        config = TransformerConfig(**preset.fields | {k: v for k, v in changed.items() if v is not None})
    except TypeError as error:
        raise ValueError(str(error)) from error
    shapes = paired_shapes(args.batch or [preset.batch], args.src_len or [preset.length],
                           args.tgt_len or args.src_len or [preset.length])
    check_lengths(config, shapes, args.decode_len)
    engines = tuple(name for name in dict.fromkeys(args.variants) if name in ENGINES)
    problems = [
        engines_problem(engines, args.decode_len, device=args.device, dtypes=tuple(args.dtype),
                        autocast=args.autocast, config=config),
        "--freeze is an option of --compile; give both" if args.freeze and not args.compile else None,
        "--max-seconds is an option of --resolution; give both"
        if args.max_seconds is not None and args.resolution is None else None,
        wait_policy_problem(args.omp_wait_policy, environ),
        # before any timing: a run must not end in a table or a picture it cannot write
        args.output and path_problem(args.output, "--output", suffix=None),
        args.plot and (path_problem(args.plot) or matplotlib_problem())]
    if problem := next((problem for problem in problems if problem), None):
        raise ValueError(problem)
    devices = ("cpu", "cuda") if args.device == "all" else (args.device,)
    processes, rounds = process_plan(args)
    try:
        return settings(args, config, shapes, engines, devices, processes, rounds, command)
    except (TypeError, ValueError) as error:  # Settings' own check, said in the options' names
        message = str(error)
        for field_name, option in OPTIONS.items():
            message = message.replace(f"Settings.{field_name}", option)
        raise ValueError(message) from None


# the fields of Settings a user sets by an option of another name, as its ValueError names them
OPTIONS = {"resolution": "--resolution", "max_seconds": "--max-seconds", "processes": "--processes",
           "rounds": "--rounds", "seed": "--seed"}


def settings(args: argparse.Namespace, config: TransformerConfig, shapes: tuple[Shape, ...],
             engines: tuple[str, ...], devices: tuple[str, ...], processes: int, rounds: int,
             command: str) -> Settings:
    """The ``Settings`` of the parsed options and what ``settings_from_options`` made of them."""
    return Settings(
        config=config, shapes=shapes, preset=args.preset,
        devices=tuple(d for d in devices if d != "cuda" or torch.cuda.is_available()),
        dtypes=tuple(args.dtype), engines=engines,
        variants=ordered(name for name in args.variants if name not in ENGINES),
        autocast=args.autocast, compile=args.compile, freeze=args.freeze,
        threads=args.threads or torch.get_num_threads(),  # compare.py settles it on the free cores
        rounds=rounds, processes=processes, min_run_time=args.min_run_time, control=not args.no_control,
        replace_weights=args.replace_weights, resolution=args.resolution,
        max_seconds=MAX_SECONDS if args.max_seconds is None else args.max_seconds,
        decode_len=args.decode_len, all_decoders=args.all_decoders, seed=args.seed,
        keep_freed_memory=args.malloc == "keep", torch_fast_path=not args.no_torch_fast_path,
        show_progress=not args.quiet, command=command)



def process_plan(args: argparse.Namespace) -> tuple[int, int]:
    """How many fresh processes the run spreads its rounds over, and how many rounds each.

    Given, ``--processes`` and ``--rounds`` are kept. A CPU run asked for neither, nor for
    ``--resolution`` (which adds rounds in one process) or ``--compile`` (each process would
    compile again), gets ``PROCESSES`` x ``ROUNDS_PER_PROCESS``: where a process's threads and
    allocator settle then varies inside the intervals. Otherwise one process of ``ROUNDS``."""
    processes = args.processes
    if processes is None:
        spread = (args.device == "cpu" and args.rounds is None and args.resolution is None
                  and not args.compile)
        processes = PROCESSES if spread else 1
    rounds = args.rounds or (ROUNDS if processes == 1 else ROUNDS_PER_PROCESS)
    return processes, rounds

