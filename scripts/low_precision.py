"""Measure how far bfloat16/float16 log-probs stray from float32, per variant and mode.

    python -m scripts.low_precision            # Markdown table on stdout (a few minutes on 2 cores)

The worst case, over post-/pre-norm, 2 and 6 layers and seeds 0-11, of the largest absolute
difference between a model's log-probs in float32 and the same model cast with
``model.to(dtype)`` or run under ``torch.autocast("cpu", dtype)``, on ``common.batches``'s
default batch. ``tests/equivalence/test_numerics.py`` bounds these at about twice the worst
case with ``LOW_PRECISION_ATOL`` below, on the same ``CONFIG``.
"""

from __future__ import annotations

import itertools
import sys

import torch

from common.batches import random_batch
from common.cli import Parser, positive
from common.config import TransformerConfig
from variants import VARIANTS, build

# The tests' small model (tests.helpers.small_config; a test keeps the two equal).
CONFIG = TransformerConfig(d_model=32, n_heads=4, n_layers=2, d_ff=48, dropout=0.1,
                           src_vocab_size=23, tgt_vocab_size=19, max_seq_len=40)
# Largest |log p(low precision) - log p(float32)| the tests allow, all positions, rtol 0: about
# twice the worst case this script measures (bfloat16 up to 0.095, float16 up to 0.013), room
# for another seed or kernel and far below what a real bug (a dropped mask) does.
LOW_PRECISION_ATOL = {torch.bfloat16: 0.15, torch.float16: 0.025}
MODES = [("to", torch.bfloat16), ("autocast", torch.bfloat16),
         ("to", torch.float16), ("autocast", torch.float16)]


def worst_difference(name: str, mode: str, dtype: torch.dtype, seeds: int) -> float:
    """Largest |Δ log-prob| of variant ``name`` in ``dtype`` over every layout and seed."""
    worst = 0.0
    for norm_first, n_layers, seed in itertools.product([False, True], [2, 6], range(seeds)):
        config = CONFIG.replace(norm_first=norm_first, n_layers=n_layers)
        inputs = random_batch(config, seed=seed).inputs()
        with torch.no_grad():
            expected = build(name, config, seed=seed).eval()(*inputs)
            model = build(name, config, seed=seed).eval()
            if mode == "to":
                actual = model.to(dtype)(*inputs)
            else:
                with torch.autocast("cpu", dtype=dtype):
                    actual = model(*inputs)
        worst = max(worst, (actual.float() - expected).abs().max().item())
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m scripts.low_precision", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=positive(int), default=12, help="seeds per layout (default 12)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # fixed reduction order: the table repeats exactly
    print("| mode | " + " | ".join(VARIANTS) + " | bound in the tests |")
    print("|---|" + "---|" * (len(VARIANTS) + 1))
    for mode, dtype in MODES:
        label = f"`model.to({dtype})`" if mode == "to" else f'`torch.autocast("cpu", {dtype})`'
        cells = [f"{worst_difference(name, mode, dtype, args.seeds):.3g}" for name in VARIANTS]
        print(f"| {label} | " + " | ".join(cells) + f" | {LOW_PRECISION_ATOL[dtype]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
