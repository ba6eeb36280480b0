"""Where a train step's time goes, per variant: a table and a stacked-bar picture.

    python -m benchmarks.studies.time_breakdown --preset tiny --out breakdown.png
    python -m benchmarks.studies.time_breakdown --preset base --dtypes float32 bfloat16 --steps eager compiled

profiles one warmed-up train step (forward, NLL, backward, Adam) per variant with
torch.profiler and groups its operators' self time (benchmarks.studies.breakdown), for each dtype
(the model cast to it) and each step: eager, or compiled as compare.py --compile compiles it.
On CPU the groups hold operators' CPU time; with ``--device cuda``, the GPU time of the kernels
each operator launched. Needs matplotlib for the picture: ``pip install -e ".[plot]"``.
"""

from __future__ import annotations

import itertools
import sys

import torch
from tabulate import tabulate

from benchmarks.compare.machine import settle_threads
from benchmarks.compare.plot import matplotlib_problem, path_problem
from benchmarks.compare.workload import DTYPES, TIMING_PRESETS
from benchmarks.studies.breakdown import GROUPS, coverage, profile_train_step
from common.cli import Parser, device_or_exit, positive
from common.config import TransformerConfig
from common.random_batch import random_batch
from variants import VARIANTS, build

STEPS = ("eager", "compiled")
DEFAULT_THREADS = 2  # on an idle machine; fewer cores found free give fewer


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m benchmarks.studies.time_breakdown", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=list(TIMING_PRESETS), default="tiny")
    parser.add_argument("--batch", type=positive(int), help="batch size (default: the preset's)")
    parser.add_argument("--length", type=positive(int),
                        help="source and target length (default: the preset's)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--dtypes", nargs="+", choices=("float32", "bfloat16"), default=["float32"])
    parser.add_argument("--steps", nargs="+", choices=STEPS, default=["eager"],
                        help="eager, and/or compiled as compare.py --compile compiles the step")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: operators' CPU time; cuda: their kernels' GPU time")
    parser.add_argument("--threads", type=positive(int),
                        help="CPU threads (default 2, fewer when other processes hold cores)")
    parser.add_argument("--repeats", type=positive(int), default=3,
                        help="profiled steps per row; the fastest is kept (default 3)")
    parser.add_argument("--ms", action="store_true", help="the table in ms per group, not %% of the step")
    parser.add_argument("--out", help="write the stacked-bar PNG here")
    args = parser.parse_args(argv)
    problem = args.out and (path_problem(args.out, "--out") or matplotlib_problem())
    if problem:
        parser.error(problem)
    device = device_or_exit(parser, args.device)
    choice = settle_threads(args.threads, DEFAULT_THREADS) if device.type == "cpu" else None  # CUDA: GPU time
    threads = choice.threads if choice else args.threads or DEFAULT_THREADS
    if choice and choice.line:
        print(f"{parser.prog}: {choice.line}", file=sys.stderr)
    torch.set_num_threads(threads)
    fields, batch, length = TIMING_PRESETS[args.preset]
    batch, length = args.batch or batch, args.length or length
    config = TransformerConfig(**fields)
    data = random_batch(config, batch, length, length, device=device)
    panels = {}  # (dtype, step) -> {variant: (total µs, {group: % of total})}
    for dtype, step in itertools.product(args.dtypes, args.steps):
        shares = {}
        for variant in args.variants:
            model = build(variant, config, seed=0).to(device, DTYPES[dtype])
            groups, total = profile_train_step(model, data, compile=step == "compiled",
                                               repeats=args.repeats)
            shares[variant] = (total, {g: 100 * t / total for g, t in groups.items()})
            shares[variant][1]["covered"] = coverage(groups, total)
        panels[dtype, step] = shares
        where = f"cpu, {threads} threads" if device.type == "cpu" else torch.cuda.get_device_name()
        print(f"\ntrain step ({dtype}, {step}, {where}), preset {args.preset}, "
              f"batch {batch} x {length} x {length}: "
              + ("ms of profiled self time" if args.ms else "% of profiled self time"))
        scale = {v: total / 1e5 if args.ms else 1.0 for v, (total, _) in shares.items()}  # % -> ms
        rows = [[v, f"{total / 1e3:.1f}", *(f"{s[g] * scale[v]:.1f}" for g in GROUPS),
                 f"{s['covered']:.1f}"] for v, (total, s) in shares.items()]
        print(tabulate(rows, ["variant", "step ms", *GROUPS, "covered %"], tablefmt="github",
                       disable_numparse=True))
    if args.out:
        picture(panels, args.out, f"train step self time, preset {args.preset}, "
                                  f"batch {batch} x {length} x {length}, {args.device}")
    return 0


def picture(panels: dict, path: str, title: str) -> None:
    """One panel per (dtype, step), one stacked bar per variant: its groups' shares."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(panels), figsize=(3 + 3.2 * len(panels), 4.5),
                                layout="constrained", sharey=True, squeeze=False)
    for ax, ((dtype, step), shares) in zip(axes[0], panels.items(), strict=True):
        bottom = [0.0] * len(shares)
        for group in GROUPS:
            heights = [s[group] for _, s in shares.values()]
            ax.bar(list(shares), heights, bottom=bottom, label=group)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.set_title(f"{dtype}, {step}", fontsize=9)
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    axes[0][0].set_ylabel("% of the profiled step")
    figure.suptitle(title, fontsize=9)
    axes[0][-1].legend(loc="center left", bbox_to_anchor=(1, 0.5), fontsize=8)
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
