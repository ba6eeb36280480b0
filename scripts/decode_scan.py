"""How the key/value cache's speed-up grows with the length generated, from one run:

    python -m scripts.decode_scan --variant explicit --batch 8 --src-len 64 --max-len 257 --threads 1

greedy-decodes the batch's sources once with the cache and once by full recompute
(``seq2seq.greedy.NextToken``, as ``greedy_decode`` steps), the two interleaved step by step
so that a busy machine slows both alike, and times every step. Both decode the same ids (the
cached run's choices). A generation of L ids (BOS included) costs the sum of its first L - 1
steps (encoding the source, the same for both, is left out), so one run gives the speed-up at
every L up to ``--max-len``: printed at the powers of two plus one, with the median step since
the previous row's L (its cost at those positions), and the first L whose speed-up reaches
``--target``. ``--ops`` instead counts the operators one cached step runs kernels for, per
variant. Base preset (the paper's model), float32, eager, CPU, random seeded weights.
Speed is reported, never asserted.
"""

from __future__ import annotations

import platform
import sys
import time
from itertools import accumulate
from statistics import median

import torch
from tabulate import tabulate

from benchmarks.machine import settle_threads
from benchmarks.workload import BOS_ID, PRESETS, eos_id
from common.batches import random_batch
from common.cli import Parser, positive
from common.config import TransformerConfig
from seq2seq.greedy import NextToken
from variants import FROM_SCRATCH, build

DEFAULT_THREADS = 2  # on an idle machine; fewer cores found free give fewer


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m scripts.decode_scan", description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=FROM_SCRATCH, default="explicit")
    parser.add_argument("--preset", choices=list(PRESETS), default="base")
    parser.add_argument("--batch", type=positive(int), default=8)
    parser.add_argument("--src-len", type=positive(int), default=64)
    parser.add_argument("--max-len", type=positive(int), default=129, help="ids per row, BOS included")
    parser.add_argument("--threads", type=positive(int),
                        help="CPU threads (default 2, fewer when other processes hold cores)")
    parser.add_argument("--target", type=positive(float), default=5.0,
                        help="report the first L at this speed-up")
    parser.add_argument("--ops", action="store_true", help="instead: count the kernel-running operators "
                        "of one cached step in every from-scratch variant")
    args = parser.parse_args(argv)
    config = TransformerConfig(**PRESETS[args.preset].fields)
    if not args.ops and not 2 <= args.max_len <= config.max_seq_len:
        parser.error(f"--max-len must lie in [2, max_seq_len={config.max_seq_len}]")
    choice = None if args.ops else settle_threads(args.threads, DEFAULT_THREADS)  # --ops times nothing
    threads = choice.threads if choice else args.threads or DEFAULT_THREADS
    if choice and choice.line:
        print(f"{parser.prog}: {choice.line}", file=sys.stderr)
    torch.set_num_threads(threads)
    if args.ops:
        src, tgt, src_mask, _ = random_batch(config, args.batch, args.src_len, 2).inputs()
        counts = [[v, step_ops(build(v, config, seed=0).eval(), src, tgt, src_mask)]
                  for v in FROM_SCRATCH]
        print(f"operators of one cached step that run a kernel, preset {args.preset}, cpu, "
              f"batch {args.batch} x src {args.src_len}")
        print(tabulate(counts, ["variant", "operators"], tablefmt="github"))
        return 0
    model = build(args.variant, config, seed=0).eval()
    src, _, src_mask, _ = random_batch(config, args.batch, args.src_len, 1).inputs()
    cached_s, uncached_s = scan(model, src, src_mask, args.max_len)
    rows, since, length = [], 0, 2
    for ids in range(2, args.max_len + 1):  # a generation of `ids` ids costs steps [0, ids - 1)
        if ids != length and ids != args.max_len:
            continue
        c, u = median(cached_s[since : ids - 1]), median(uncached_s[since : ids - 1])
        total_cached, total_uncached = sum(cached_s[: ids - 1]), sum(uncached_s[: ids - 1])
        rows.append([ids, f"{1e3 * c:.0f}", f"{1e3 * u:.0f}", f"{u / c:.1f}x",
                     f"{args.batch * (ids - 1) / total_cached:.0f}",
                     f"{args.batch * (ids - 1) / total_uncached:.0f}",
                     f"{total_uncached / total_cached:.1f}x"])
        since, length = ids - 1, 2 * length - 1
    print(f"{args.variant}, preset {args.preset}, float32, cpu ({platform.machine()}, "
          f"{threads} threads, torch {torch.__version__}), batch {args.batch} x src {args.src_len}")
    print(tabulate(rows, ["L (ids incl. BOS)", "cached step ms", "uncached step ms", "step ratio",
                          "cached tok/s", "uncached tok/s", "speed-up"],
                   tablefmt="github", disable_numparse=True))
    totals = zip(accumulate(cached_s), accumulate(uncached_s), strict=True)
    reached = next((steps + 1 for steps, (c, u) in enumerate(totals, start=1) if u >= args.target * c), None)
    print(f"speed-up first >= {args.target:g}x at L = {reached} ids" if reached else
          f"speed-up below {args.target:g}x up to L = {args.max_len} ids")
    return 0


# operators that only make a view, allocate or read metadata: no kernel runs
METADATA_OPS = frozenset(f"aten::{name}" for name in (
    "view", "reshape", "_reshape_alias", "_unsafe_view", "transpose", "t", "permute", "expand",
    "unsqueeze", "squeeze", "slice", "select", "as_strided", "alias", "detach", "split", "chunk",
    "unbind", "unflatten", "flatten", "empty", "empty_like", "empty_strided", "contiguous",
    "lift_fresh", "resolve_conj", "resolve_neg", "result_type", "to", "dim", "item",
    "_local_scalar_dense", "is_nonzero"))


@torch.no_grad()
def step_ops(model: torch.nn.Module, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor) -> int:
    """How many operators that run a kernel one cached step (``decode_step`` and ``project``, at
    position 1) dispatches: the profiled aten operators that call no other, less the
    metadata-only ones. A proxy for a CUDA step's kernel launches, which were not counted."""
    from torch.profiler import ProfilerActivity, profile

    cache = model.start_cache(model.encode(src, src_mask), src_mask)
    model.project(model.decode_step(tgt[:, :1], cache))
    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        model.project(model.decode_step(tgt[:, 1:2], cache))
    events = [e for e in profiled.events() if e.name.startswith("aten::")]
    leaves = [e for e in events if not any(c.name.startswith("aten::") for c in e.cpu_children)]
    return sum(e.name not in METADATA_OPS for e in leaves)


@torch.no_grad()
def scan(model: torch.nn.Module, src: torch.Tensor, src_mask: torch.Tensor, max_len: int
         ) -> tuple[list[float], list[float]]:
    """Seconds of each greedy step, with the cache and by full recompute, interleaved."""
    eos = eos_id(model.config)  # as compare.py's: random weights seldom choose it
    cached = NextToken(model, src, src_mask, use_cache=True)
    uncached = NextToken(model, src, src_mask, use_cache=False)
    tokens = torch.full((src.shape[0], 1), BOS_ID, dtype=torch.long)  # (B, 1)
    cached_s, uncached_s = [], []
    for _ in range(max_len - 1):
        started = time.perf_counter()
        logp = cached(tokens)  # (B, V)
        cached_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        uncached(tokens)
        uncached_s.append(time.perf_counter() - started)
        next_token = logp.argmax(dim=-1)  # (B,)
        if (next_token == eos).any():
            raise RuntimeError("a row reached EOS: the steps would no longer match greedy_decode's")
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (B, L + 1)
    return cached_s, uncached_s


if __name__ == "__main__":
    sys.exit(main())
