"""Measure how far bfloat16/float16 log-probs stray from float32, per variant and mode.

    python -m benchmarks.studies.low_precision     # Markdown table on stdout (a few minutes on 2 cores)

The worst case, over post-/pre-norm, 2 and 6 layers and seeds 0-11, of the largest absolute
difference between a model's log-probs in float32 and the same model cast with
``model.to(dtype)`` or run under ``torch.autocast("cpu", dtype)``, on ``common.random_batch``'s
default batch. The table shows measurements only. ``MEASURED`` records the last run's cells;
``tests/equivalence/test_numerics.py`` derives its bounds from them (times a margin it states),
and a slow test there checks that ``measure()`` still finds every cell within a factor of 2
(another CPU's float32 and float16 kernels round differently; the digits are this CPU's).
"""

from __future__ import annotations

import copy
import itertools
import sys

import torch

from common.cli import Parser, positive
from common.config import TransformerConfig
from common.random_batch import random_batch
from variants import VARIANTS, build

# The tests' small model (tests.helpers.small_config; a test keeps the two equal).
CONFIG = TransformerConfig(d_model=32, n_heads=4, n_layers=2, d_ff=48, dropout=0.1,
                           src_vocab_size=23, tgt_vocab_size=19, max_seq_len=40)
MODES = [("to", torch.bfloat16), ("autocast", torch.bfloat16),
         ("to", torch.float16), ("autocast", torch.float16)]
SEEDS = 12
# What ``measure()`` printed on an AMD EPYC CPU, torch 2.13.0, one thread, to the 3 digits the
# table shows (an Intel Xeon's kernels give other digits, e.g. explicit ``to(float16)`` 0.0135):
# mode -> variant -> worst |log p(low precision) - log p(float32)| over the 48 runs.
MEASURED: dict[tuple[str, torch.dtype], dict[str, float]] = {
    ("to", torch.bfloat16):
        {"explicit": 0.0818, "einsum": 0.0773, "mathfirst": 0.0847, "fused": 0.0803, "torch": 0.071},
    ("autocast", torch.bfloat16):
        {"explicit": 0.0557, "einsum": 0.0557, "mathfirst": 0.0459, "fused": 0.0633, "torch": 0.0873},
    ("to", torch.float16):
        {"explicit": 0.0101, "einsum": 0.00863, "mathfirst": 0.0135, "fused": 0.00902, "torch": 0.0117},
    ("autocast", torch.float16):
        {"explicit": 0.006, "einsum": 0.00606, "mathfirst": 0.00594, "fused": 0.00696, "torch": 0.00991},
}


def worst_differences(name: str, seeds: int) -> dict[tuple[str, torch.dtype], float]:
    """Largest |Δ log-prob| of variant ``name`` in each of ``MODES`` over every layout and seed.

    One float32 model and its log-probs per layout and seed serve all four modes; each mode runs
    on its own copy (``model.to`` casts in place), so every cell is what a separate build gives.
    """
    worst = dict.fromkeys(MODES, 0.0)
    for norm_first, n_layers, seed in itertools.product([False, True], [2, 6], range(seeds)):
        config = CONFIG.replace(norm_first=norm_first, n_layers=n_layers)
        inputs = random_batch(config, seed=seed).inputs()
        float32 = build(name, config, seed=seed).eval()
        with torch.no_grad():
            expected = float32(*inputs)
            for mode, dtype in MODES:
                model = copy.deepcopy(float32)
                if mode == "to":
                    actual = model.to(dtype)(*inputs)
                else:
                    with torch.autocast("cpu", dtype=dtype):
                        actual = model(*inputs)
                difference = (actual.float() - expected).abs().max().item()
                worst[mode, dtype] = max(worst[mode, dtype], difference)
    return worst


def measure(seeds: int = SEEDS) -> dict[tuple[str, torch.dtype], dict[str, float]]:
    """Every cell of the table, rounded to the 3 digits it shows (``MEASURED``'s form)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # fixed reduction order: the table repeats exactly
    try:
        cells = {name: worst_differences(name, seeds) for name in VARIANTS}
        return {(mode, dtype): {name: float(f"{cells[name][mode, dtype]:.3g}") for name in VARIANTS}
                for mode, dtype in MODES}
    finally:
        torch.set_num_threads(threads)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m benchmarks.studies.low_precision", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=positive(int), default=SEEDS,
                        help=f"seeds per layout (default {SEEDS})")
    args = parser.parse_args(argv)
    print("| mode | " + " | ".join(VARIANTS) + " |")
    print("|---|" + "---|" * len(VARIANTS))
    for (mode, dtype), cells in measure(args.seeds).items():
        label = f"`model.to({dtype})`" if mode == "to" else f'`torch.autocast("cpu", {dtype})`'
        print(f"| {label} | " + " | ".join(f"{cells[name]:.3g}" for name in VARIANTS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
