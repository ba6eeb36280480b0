"""The breakdown's command (a program, like compare.py, not library code: it prints).

Where a train step's time goes, per variant: a table and a stacked-bar picture.

    python -m benchmarks.time_breakdown --preset tiny --out breakdown.png

profiles one warmed-up train step (forward, NLL, backward, Adam) per variant with
torch.profiler and groups its operators' self time (benchmarks.breakdown). float32, eager,
CPU. Needs matplotlib for the picture: ``pip install -e ".[plot]"``.
"""

from __future__ import annotations

import argparse
import sys

import torch
from tabulate import tabulate

from benchmarks.breakdown import GROUPS, profile_train_step
from benchmarks.plot import matplotlib_problem, path_problem
from benchmarks.workload import PRESETS
from common.batches import random_batch
from common.config import TransformerConfig
from variants import VARIANTS, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=list(PRESETS), default="tiny")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="write the stacked-bar PNG here")
    args = parser.parse_args(argv)
    problem = args.out and (path_problem(args.out, "--out") or matplotlib_problem())
    if problem:
        parser.error(problem)
    torch.set_num_threads(args.threads)
    fields, batch, length = PRESETS[args.preset]
    config = TransformerConfig(**fields)
    data = random_batch(config, batch, length, length)
    shares = {}
    for variant in VARIANTS:
        groups, total = profile_train_step(build(variant, config, seed=0), data)
        shares[variant] = (total, {g: 100 * t / total for g, t in groups.items()})
    rows = [[v, f"{total / 1e3:.1f}", *(f"{s[g]:.1f}" for g in GROUPS)]
            for v, (total, s) in shares.items()]
    print(f"train step (float32, eager, cpu, {args.threads} threads), preset {args.preset}, "
          f"batch {batch} x {length} x {length}: % of profiled self time")
    print(tabulate(rows, ["variant", "step ms", *GROUPS], tablefmt="github", disable_numparse=True))
    if args.out:
        picture(shares, args.out, f"train step self time, preset {args.preset}, "
                                  f"batch {batch} x {length} x {length}, float32, cpu")
    return 0


def picture(shares: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    bottom = [0.0] * len(shares)
    for group in GROUPS:
        heights = [s[group] for _, s in shares.values()]
        ax.bar(list(shares), heights, bottom=bottom, label=group)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_ylabel("% of the profiled step")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="center left", bbox_to_anchor=(1, 0.5), fontsize=8)
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
