"""How the key/value cache's speed-up grows with the length generated, from one run:

    python -m benchmarks.studies.decode_scan --variant explicit --batch 8 --src-len 64 --max-len 257 \
        --threads 1

greedy-decodes the batch's sources once with the cache and once by full recompute
(``seq2seq.search.strategy.NextToken``, as ``greedy_decode`` steps), the two interleaved step by step
so that a busy machine slows both alike, and times every step. Both decode the same ids (the
cached run's choices). A generation of L ids (BOS included) costs the sum of its first L - 1
steps (encoding the source, the same for both, is left out), so one run gives the speed-up at
every L up to ``--max-len``: printed at the powers of two plus one, with the median step since
the previous row's L (its cost at those positions), and the first L whose speed-up reaches
``--target``. ``--ops`` instead counts the operators one cached step runs kernels for, per
variant. Base preset (the paper's model), float32, eager, CPU, random seeded weights.
Speed is reported, never asserted.

The machine's limit, measured in the same run: at a small batch a cached step reads every
weight it multiplies once (``benchmarks.studies.bandwidth`` counts them), so it cannot beat
"weight bytes / read bandwidth", the bandwidth being ``torch.sum``'s over a buffer well above
the last-level cache, measured before and after the scan (the faster of the two is the bound).
"at limit" is that bound over the row's median cached step: 100% would be a step that only
streams its weights. The levers change what the cached step is made of (the uncached path
keeps the model's eager step): ``--decode-dtype`` casts the model, ``--generator-layout dv``
projects through a (D, V) contiguous copy of the generator's weight, ``--compile-step`` runs the
cached step through torch.compile (compiled before the timed run), ``--static`` uses fused's
static-shape step (``seq2seq.fast.static_search``), and ``--freezing`` with both compiles it with
inductor freezing, and ``--onednn`` runs its linears on oneDNN (``seq2seq.fast.onednn``):
the levers of compare.py's inductor row.
"""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from itertools import accumulate
from statistics import median

import torch
import torch.nn.functional as F
from tabulate import tabulate
from torch import Tensor

from benchmarks.compare.machine import settle_threads
from benchmarks.compare.workload import DTYPES, TIMING_PRESETS
from benchmarks.studies.bandwidth import BandwidthSettings, read_bandwidth, step_weight_bytes
from common.checks import model_dtype
from common.cli import Parser, positive
from common.config import TransformerConfig
from common.random_batch import random_batch
from common.weights import export_weights
from seq2seq.data.ids import BOS_ID, timing_eos_id
from seq2seq.fast.static_search import StaticNextToken
from seq2seq.search.strategy import NextToken
from variants import FROM_SCRATCH, build

DEFAULT_THREADS = 2  # on an idle machine; fewer cores found free give fewer


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m benchmarks.studies.decode_scan", description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=FROM_SCRATCH, default="explicit")
    parser.add_argument("--preset", choices=list(TIMING_PRESETS), default="base")
    parser.add_argument("--batch", type=positive(int), default=8)
    parser.add_argument("--src-len", type=positive(int), default=64)
    parser.add_argument("--max-len", type=positive(int), default=129, help="ids per row, BOS included")
    parser.add_argument("--threads", type=positive(int),
                        help="CPU threads (default 2, fewer when other processes hold cores)")
    parser.add_argument("--target", type=positive(float), default=5.0,
                        help="report the first L at this speed-up")
    parser.add_argument("--ops", action="store_true", help="instead: count the kernel-running operators "
                        "of one cached step in every from-scratch variant")
    parser.add_argument("--decode-dtype", choices=list(DTYPES), default="float32",
                        help="the model's dtype while decoding (weights and activations)")
    parser.add_argument("--generator-layout", choices=GENERATOR_LAYOUTS, default="linear",
                        help="linear: nn.Linear's (V, D) weight; dv: x @ W with a (D, V) contiguous copy")
    parser.add_argument("--compile-step", action="store_true",
                        help="the cached step through torch.compile (inductor), compiled before timing")
    parser.add_argument("--static", action="store_true",
                        help="fused's static-shape cached step (a preallocated cache), not the growing one")
    parser.add_argument("--freezing", action="store_true",
                        help="with --static --compile-step: inductor freezing (the weights prepacked "
                        "as constants of the compiled step), the fast decoding path")
    parser.add_argument("--onednn", action="store_true",
                        help="with --static: the model's linears on oneDNN, weights packed once")
    parser.add_argument("--bandwidth-mib", type=positive(int),
                        help="the buffer the read bandwidth is measured on (default: 4x the last-level "
                        "cache, at least 256 MiB)")
    parser.add_argument("--bandwidth-seconds", type=positive(float), default=0.5,
                        help="seconds of timed sums per bandwidth measurement (one before, one after)")
    args = parser.parse_args(argv)
    config = TransformerConfig(**TIMING_PRESETS[args.preset].fields)
    if not args.ops and not 2 <= args.max_len <= config.max_seq_len:
        parser.error(f"--max-len must lie in [2, max_seq_len={config.max_seq_len}]")
    if args.src_len > config.max_seq_len:
        parser.error(f"--src-len must be at most the preset's max_seq_len={config.max_seq_len}, "
                     f"got {args.src_len}")
    if args.freezing and not (args.static and args.compile_step):
        parser.error("--freezing is a lever of the compiled static step: "
                     "give --static and --compile-step too")
    plain_float32 = args.decode_dtype == "float32" and args.generator_layout == "linear"
    if args.onednn and not (args.static and plain_float32 and not args.compile_step):
        parser.error("--onednn is a lever of the float32 static step with nn.Linear's generator, eager: "
                     "give --static, without --decode-dtype, --generator-layout or --compile-step")
    if args.static and args.variant != "fused":
        parser.error(f"--static needs --variant fused (the one row with a static step), got {args.variant}")
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
    levers = Levers(DTYPES[args.decode_dtype], args.generator_layout, args.compile_step, args.static,
                    args.freezing, args.onednn)
    model = build(args.variant, config, seed=0).to(levers.decode_dtype).eval()
    src, _, src_mask, _ = random_batch(config, args.batch, args.src_len, 1).inputs()
    bandwidth = BandwidthSettings(threads=threads, min_run_time=args.bandwidth_seconds,
                                  buffer_bytes=args.bandwidth_mib and args.bandwidth_mib * 2**20)
    before = read_bandwidth(bandwidth)
    cached = cached_next_token(model, src, src_mask, args.max_len, levers)
    uncached = NextToken(model, src, src_mask, use_cache=False)
    cached_s, uncached_s = scan(cached, uncached, src.shape[0], timing_eos_id(config), args.max_len)
    after = read_bandwidth(bandwidth)
    weights = step_weight_bytes(config, model_dtype(model), args.batch)
    fastest = max(before.bytes_per_second, after.bytes_per_second)  # the machine's limit
    bound_s = weights.total / fastest
    rows, since, length = [], 0, 2
    for ids in range(2, args.max_len + 1):  # a generation of `ids` ids costs steps [0, ids - 1)
        if ids != length and ids != args.max_len:
            continue
        c, u = median(cached_s[since : ids - 1]), median(uncached_s[since : ids - 1])
        total_cached, total_uncached = sum(cached_s[: ids - 1]), sum(uncached_s[: ids - 1])
        rows.append([ids, f"{1e3 * c:.0f}", f"{bound_s / c:.0%}", f"{1e3 * u:.0f}", f"{u / c:.1f}x",
                     f"{args.batch * (ids - 1) / total_cached:.0f}",
                     f"{args.batch * (ids - 1) / total_uncached:.0f}",
                     f"{total_uncached / total_cached:.1f}x"])
        since, length = ids - 1, 2 * length - 1
    print(f"{args.variant}, preset {args.preset}, {args.decode_dtype}, cpu ({platform.machine()}, "
          f"{threads} threads, torch {torch.__version__}), batch {args.batch} x src {args.src_len}; "
          f"cached step: {levers.describe()}")
    print(f"limit: {weights.total / 1e6:.1f} MB of weights per step / {fastest / 1e9:.2f} GB/s read = "
          f"{1e3 * bound_s:.2f} ms (read bandwidth {before.bytes_per_second / 1e9:.2f} GB/s before the "
          f"scan, {after.bytes_per_second / 1e9:.2f} after, on {before.buffer_bytes / 2**20:.0f} MiB)")
    print(tabulate(rows, ["L (ids incl. BOS)", "cached step ms", "at limit", "uncached step ms",
                          "step ratio", "cached tok/s", "uncached tok/s", "speed-up"],
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


NextTokenLogp = Callable[[Tensor], Tensor]  # (B, L) prefixes -> (B, V) next-token log-probs
GENERATOR_LAYOUTS = ("linear", "dv")
WARM_UP_STEPS = 4  # compiled: lengths 0 and 1 are specialised, the third step compiles dynamic shapes


@dataclass(frozen=True)
class Levers:
    """What the scan's cached step is made of, beyond the variant (the options of these names)."""

    decode_dtype: torch.dtype = torch.float32  # the model's weights and activations while decoding
    generator_layout: str = "linear"  # "linear": nn.Linear's (V, D) weight; "dv": a (D, V) copy
    compile_step: bool = False  # the cached step through torch.compile (inductor, default mode)
    static: bool = False  # fused's static-shape step (preallocated cache) instead of the growing one
    freezing: bool = False  # with compile_step and static: inductor freezing (weights prepacked)
    onednn: bool = False  # with static: the model's linears on oneDNN (seq2seq.fast.onednn)

    def describe(self) -> str:
        parts = ["static" if self.static else "growing cache", f"generator {self.generator_layout}"]
        parts += ["oneDNN linears"] if self.onednn else []
        return ", ".join([*parts, ("compiled, frozen" if self.freezing else "compiled")
                          if self.compile_step else "eager"])


class DVGenerator:
    """A model whose ``project`` multiplies by the generator's weight held as a (D, V) contiguous
    copy, ``addmm(b, x, W)``, instead of nn.Linear's (V, D) weight read transposed; the rest is
    the model's. The weight comes by its canonical name, so any variant can be wrapped."""

    def __init__(self, model: torch.nn.Module) -> None:
        weights = export_weights(model)
        self.model = model
        self.weight = weights["generator.weight"].t().contiguous()  # (D, V)
        self.bias = weights["generator.bias"]  # (V,)

    def __getattr__(self, name: str) -> object:  # encode, decode, the caches, config: the model's
        return getattr(self.model, name)

    def project(self, hidden: Tensor) -> Tensor:
        logits = torch.addmm(self.bias, hidden.flatten(0, 1), self.weight)  # (B * T, V)
        return F.log_softmax(logits, dim=-1).unflatten(0, hidden.shape[:2])  # (B, T, V)


def call(next_token: NextTokenLogp, tokens: Tensor) -> Tensor:
    """What ``--compile-step`` compiles: one cached step of ``next_token`` (any NextToken)."""
    return next_token(tokens)


def cached_next_token(model: torch.nn.Module, src: Tensor, src_mask: Tensor, max_len: int,
                      levers: Levers) -> NextTokenLogp:
    """The scan's cached step under ``levers``, compiled (and warmed up) where asked."""
    if levers.generator_layout == "dv":
        model = DVGenerator(model)
    if levers.static:
        static = StaticNextToken(model, max_len, "default" if levers.compile_step else None,
                                 freezing=levers.freezing, onednn=levers.onednn)
        static.start(src, src_mask)
        if levers.compile_step:
            greedy_steps(static, src.shape[0], min(WARM_UP_STEPS, max_len - 1))
            static.start(src, src_mask)  # the same cache, refilled: no new compile
        return static
    if not levers.compile_step:
        return NextToken(model, src, src_mask, use_cache=True)
    compiled = torch.compile(call)
    warm_up = partial(compiled, NextToken(model, src, src_mask, use_cache=True))
    greedy_steps(warm_up, src.shape[0], min(WARM_UP_STEPS, max_len - 1))
    return partial(compiled, NextToken(model, src, src_mask, use_cache=True))


@torch.no_grad()
def greedy_steps(next_token: NextTokenLogp, batch: int, steps: int) -> None:
    """``steps`` untimed greedy steps from BOS: a compiled step's warm-up."""
    tokens = torch.full((batch, 1), BOS_ID, dtype=torch.long)  # (B, 1)
    for _ in range(steps):
        tokens = torch.cat([tokens, next_token(tokens).argmax(dim=-1)[:, None]], dim=1)  # (B, L + 1)


@torch.no_grad()
def scan(cached: NextTokenLogp, uncached: NextTokenLogp, batch: int, eos: int, max_len: int
         ) -> tuple[list[float], list[float]]:
    """Seconds of each greedy step, with the cache and by full recompute, interleaved. ``eos``
    as compare.py's (random weights seldom choose it): a row that reaches it ends the scan, an error."""
    tokens = torch.full((batch, 1), BOS_ID, dtype=torch.long)  # (B, 1)
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
