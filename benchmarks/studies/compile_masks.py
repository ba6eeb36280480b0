"""Where a compiled train step's dropout masks come from, and what it costs: eager, inductor's
own in-kernel masks, and the suite's backend (masks from aten, benchmarks.compare.dropout_masks).

    python -m benchmarks.studies.compile_masks --variant explicit --preset base --steps 5 --top 12

Times one train step (forward, NLL, backward; no optimizer) of each kind in turn, ``--steps``
times each, with glibc keeping freed memory as compare.py does, and prints the fastest and the
median; ``--top N`` then profiles one step of each and lists its N costliest operators and
kernels by self time. CPU.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict
from functools import partial

import torch

from benchmarks.compare.memory import keep_freed_memory, quiet_stderr
from benchmarks.compare.steps import CompiledModel, compiled, forward_backward, token_nll
from benchmarks.compare.workload import TIMING_PRESETS
from common.cli import Parser, positive
from common.config import TransformerConfig
from common.random_batch import random_batch
from variants import VARIANTS, build


class InductorMasks(CompiledModel):
    """The suite's compiled train step, but through plain inductor: its own dropout masks."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model, {})
        self.__dict__["loss_graph"] = torch.compile(partial(token_nll, model),
                                                    options={"cpp.enable_kernel_profile": True})


def top_ops(step, n: int) -> list[str]:
    """The ``n`` costliest operators and kernels of one profiled ``step``, by self time."""
    with quiet_stderr(), torch.profiler.profile() as profile:
        step()
    self_ms, calls = defaultdict(float), defaultdict(int)
    for event in profile.events():
        self_ms[event.name] += event.self_cpu_time_total / 1e3
        calls[event.name] += 1
    ranked = sorted(self_ms, key=self_ms.get, reverse=True)[:n]
    return [f"  {self_ms[name]:8.1f} ms  x{calls[name]:<4d} {name[:100]}" for name in ranked]


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m benchmarks.studies.compile_masks", description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=VARIANTS, default="explicit")
    parser.add_argument("--preset", choices=list(TIMING_PRESETS), default="small")
    parser.add_argument("--steps", type=positive(int), default=5, help="timed steps of each kind")
    parser.add_argument("--top", type=int, default=0, help="profile one step of each; list N ops")
    parser.add_argument("--threads", type=positive(int), default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    fields, batch, length = TIMING_PRESETS[args.preset]
    config = TransformerConfig(**fields)
    data = random_batch(config, batch, length, length)
    model = build(args.variant, config, seed=0).train()
    steps = {"eager": forward_backward(model, data),
             "inductor's masks": forward_backward(InductorMasks(model), data),
             "aten masks (the suite's)": forward_backward(compiled(model, False, profile_kernels=True),
                                                          data)}
    for step in steps.values():
        step()  # compiles
    seconds = defaultdict(list)
    for _ in range(args.steps):
        for kind, step in steps.items():
            started = time.perf_counter()
            step()
            seconds[kind].append(time.perf_counter() - started)
    print(f"{args.variant}, preset {args.preset}, batch {batch} x {length}, {args.threads} threads: "
          "train step (forward, NLL, backward) in s")
    for kind, times in seconds.items():
        print(f"  {kind:<26} fastest {min(times):.3f}  median {statistics.median(times):.3f}")
    for kind, step in steps.items() if args.top else ():
        print(f"{kind}: the {args.top} costliest ops", *top_ops(step, args.top), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
