"""Which library multiplies a decode step's linears on this CPU, and how fast each path is:

    python -m benchmarks.studies.gemm_paths --threads 2

times the product of a (B, D_in) activation with each linear weight a base decode step reads
(section 3 sizes: 512 -> 1536 fused QKV, 512 -> 2048 and 2048 -> 512 feed-forward, 512 -> 37000
generator), float32, three ways PyTorch offers: ``F.linear`` (MKL's SGEMM on x86 builds), MKL's
packed product (``torch.ops.mkl._mkl_linear``, what inductor freezing runs for float32) and
oneDNN's packed product (``torch.ops.mkldnn._linear_pointwise``, ``seq2seq.fast.onednn``).
Each row gives the median time (``torch.utils.benchmark``), the weight bytes read per second and
the largest difference from ``F.linear``. First it prints MKL's own report of the code path it
chose for this CPU (``MKL_VERBOSE=1`` in a child process): on x86 CPUs other than Intel's, MKL
names no instruction set. Speed is reported, never asserted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from tabulate import tabulate
from torch.utils.benchmark import Timer

from benchmarks.compare.report import machine
from common.cli import Parser, positive

# (D_in, D_out) of a base step's linears: fused QKV, feed-forward in and out, generator
SHAPES = ((512, 1536), (512, 2048), (2048, 512), (512, 37000))
# the most activation rows timed: a decode step's batch (sources x beams) is far below it, and at
# 1024 the generator's (1024, 37000) float32 output is 152 MB; far more only fails in the allocator
MAX_BATCH = 1024
MKL_PROBE = "import torch; x = torch.ones(8, 64); torch.nn.functional.linear(x, torch.ones(64, 64))"


def mkl_code_path() -> str:
    """MKL's first verbose line in a child process: its version and the instruction set it chose."""
    child = subprocess.run([sys.executable, "-c", MKL_PROBE], capture_output=True, text=True,
                           env={**os.environ, "MKL_VERBOSE": "1"}, timeout=120, check=False)
    lines = [line for line in child.stdout.splitlines()
             if line.startswith("MKL_VERBOSE") and "SGEMM" not in line]
    return lines[0] if lines else "MKL printed no report (not an MKL build?)"


def products(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """(B, D_in) x by the (D_out, D_in) weight w, plus b, by each path this build has."""
    batch = x.shape[0]
    calls = {"F.linear": lambda: F.linear(x, w, b)}
    if torch._C.has_mkl:
        mkl_w = torch.ops.mkl._mkl_reorder_linear_weight(w, batch)
        calls["MKL packed"] = lambda: torch.ops.mkl._mkl_linear(x, mkl_w, w, b, batch)
    if torch.backends.mkldnn.is_available():
        dnn_w = torch.ops.mkldnn._reorder_linear_weight(w, batch)
        calls["oneDNN packed"] = lambda: torch.ops.mkldnn._linear_pointwise(x, dnn_w, b, "none", [], "")
    return calls


def time_paths(batch: int, min_run_time: float) -> list[list[str]]:
    """A row per (shape, path): shape, path, µs, GB/s of weights, largest difference from F.linear."""
    rows = []
    for d_in, d_out in SHAPES:
        calls = products(torch.randn(batch, d_in), torch.randn(d_out, d_in) / d_in**0.5, torch.randn(d_out))
        expected = calls["F.linear"]()
        for name, call in calls.items():
            timer = Timer("call()", globals={"call": call})
            seconds = timer.blocked_autorange(min_run_time=min_run_time).median
            rows.append([f"{d_in} -> {d_out}", name, f"{1e6 * seconds:,.0f}",
                         f"{4 * d_in * d_out / seconds / 1e9:.1f}",
                         f"{(call() - expected).abs().max().item():.1e}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m benchmarks.studies.gemm_paths", description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=positive(int), default=8,
                        help=f"rows of the activation, at most {MAX_BATCH} (default 8)")
    parser.add_argument("--threads", type=positive(int), default=2)
    parser.add_argument("--min-run-time", type=positive(float), default=0.5)
    args = parser.parse_args(argv)
    if args.batch > MAX_BATCH:
        parser.error(f"--batch must be at most {MAX_BATCH} (a decode step's rows; the generator's output "
                     f"alone is batch x {SHAPES[-1][1]} floats), got {args.batch}")
    torch.set_num_threads(args.threads)
    print(f"{machine()['cpu_model']}, {args.threads} threads, torch {torch.__version__}, "
          f"batch {args.batch}, float32")
    print(mkl_code_path())
    print(tabulate(time_paths(args.batch, args.min_run_time),
                   ["linear (D_in -> D_out)", "path", "µs", "weight GB/s", "max |diff| from F.linear"],
                   tablefmt="github", disable_numparse=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
