"""``Settings``: everything one run is asked to do, fixed before it starts."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from benchmarks.engines import ENGINES, engines_problem
from benchmarks.machine import ThreadChoice, wait_policy_problem
from benchmarks.plot import matplotlib_problem, path_problem
from benchmarks.workload import PRESETS, Shape, check_lengths, paired_shapes
from common.config import TransformerConfig
from variants import VARIANTS, ordered

# Many short rounds rather than a few long ones: a burst of other work then spoils one round's
# ratios, which the interval over rounds shows, instead of one row's whole time.
ROUNDS = 10
MIN_RUN_TIME = 0.05


@dataclass(frozen=True)
class Settings:
    """What ``benchmarks.run.run`` measures and how. One block per (device, dtype, shape)."""

    config: TransformerConfig  # the model every row builds
    shapes: tuple[Shape, ...]  # the batch shapes, one block each
    preset: str = "custom"  # the name the header gives the model size
    devices: tuple[str, ...] = ("cpu",)  # "cpu" and/or "cuda"
    dtypes: tuple[str, ...] = ("float32",)  # names in workload.DTYPES; the model is cast to each
    variants: tuple[str, ...] = VARIANTS  # the timed rows; the reference is built regardless
    engines: tuple[str, ...] = ()  # deployment engines timed as decode rows beside them
    # (benchmarks.engines.ENGINES; CPU float32 blocks only, float32 and int8 rows each)
    autocast: bool = False  # keep float32 weights and run under torch.autocast(dtype) instead
    compile: bool = False  # torch.compile each model and time its eager steps alongside
    freeze: bool = False  # with compile: inductor freezing for the eval forward
    threads: int = field(default_factory=torch.get_num_threads)  # CPU threads, set for the run
    thread_choice: ThreadChoice | None = None  # how `threads` was chosen and how busy the cores
    # were before the run (benchmarks.machine.settle_threads); None: not checked
    rounds: int = ROUNDS  # rounds; each times every row once, in a fresh shuffled order
    min_run_time: float = MIN_RUN_TIME  # seconds of a cell's block of calls a round (at least one)
    control: bool = True  # time a second, separately built torch row: the run's resolution
    order_seed: int = 0  # seeds the rounds' shuffled orders (a process of --processes N: its index)
    decode_len: int = 16  # greedy-decoding length counting BOS; 1 skips the decode column
    all_decoders: bool = False  # also greedy by full recompute and beam 4 (compare.py --all-decoders)
    seed: int = 0  # the weights' and the batch's seed
    keep_freed_memory: bool = True  # tell glibc to keep freed memory (memory.keep_freed_memory)
    torch_fast_path: bool = True  # let nn.Transformer use its fused eval kernels
    show_progress: bool = True  # a progress bar on stderr
    command: str = ""  # how the run was asked for, recorded in the report

    @property
    def modes(self) -> tuple[str, ...]:
        """The steps timed for every row, in the order each round runs them."""
        decoders = ("decode", "decode_uncached", "beam") if self.all_decoders else ("decode",)
        modes = ("forward", "train") + (decoders if self.decode_len > 1 else ())
        # with compile, the eager steps too, timed in the same rounds: the speed-up columns
        return modes + (("forward_eager", "train_eager") if self.compile else ())


def settings_from_options(args: argparse.Namespace, command: str, environ: Mapping[str, str]) -> Settings:
    """compare.py's options as the run's ``Settings``, every value checked before any work:
    ValueError names the first that cannot run (the model's fields, lengths, engine rows, the
    wait policy, a table or picture that could not be written)."""
    preset = PRESETS[args.preset]
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
                        autocast=args.autocast),
        "--freeze is an option of --compile; give both" if args.freeze and not args.compile else None,
        wait_policy_problem(args.omp_wait_policy, environ),
        # before any timing: a run must not end in a table or a picture it cannot write
        args.output and path_problem(args.output, "--output", suffix=None),
        args.plot and (path_problem(args.plot) or matplotlib_problem())]
    if problem := next((problem for problem in problems if problem), None):
        raise ValueError(problem)
    devices = ("cpu", "cuda") if args.device == "all" else (args.device,)
    return Settings(
        config=config, shapes=shapes, preset=args.preset,
        devices=tuple(d for d in devices if d != "cuda" or torch.cuda.is_available()),
        dtypes=tuple(args.dtype), engines=engines,
        variants=ordered(name for name in args.variants if name not in ENGINES),
        autocast=args.autocast, compile=args.compile, freeze=args.freeze,
        threads=args.threads or torch.get_num_threads(),  # compare.py settles it on the free cores
        rounds=args.rounds, min_run_time=args.min_run_time, control=not args.no_control,
        decode_len=args.decode_len, all_decoders=args.all_decoders, seed=args.seed,
        keep_freed_memory=args.malloc == "keep", torch_fast_path=not args.no_torch_fast_path,
        show_progress=not args.quiet, command=command)

