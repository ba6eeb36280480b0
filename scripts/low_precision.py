"""Measure how far bfloat16/float16 log-probs stray from float32, per variant and mode.

    python -m scripts.low_precision            # Markdown table on stdout (a few minutes on 2 cores)

The worst case, over post-/pre-norm, 2 and 6 layers and seeds 0-11, of the largest absolute
difference between a model's log-probs in float32 and the same model cast with
``model.to(dtype)`` or run under ``torch.autocast("cpu", dtype)``. ``tests/equivalence/test_numerics.py``
bounds these at about twice the worst case (``LOW_PRECISION_ATOL``).
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch

from tests.helpers import make_batch, small_config
from tests.equivalence.test_numerics import LOW_PRECISION_ATOL
from variants import VARIANTS, build

MODES = [("to", torch.bfloat16), ("autocast", torch.bfloat16),
         ("to", torch.float16), ("autocast", torch.float16)]


def worst_difference(name: str, mode: str, dtype: torch.dtype, seeds: int) -> float:
    worst = 0.0
    for norm_first, n_layers, seed in itertools.product([False, True], [2, 6], range(seeds)):
        config = small_config(norm_first=norm_first, n_layers=n_layers)
        batch = make_batch(config, seed=seed)
        with torch.no_grad():
            expected = build(name, config, seed=seed).eval()(*batch)
            model = build(name, config, seed=seed).eval()
            if mode == "to":
                actual = model.to(dtype)(*batch)
            else:
                with torch.autocast("cpu", dtype=dtype):
                    actual = model(*batch)
        worst = max(worst, (actual.float() - expected).abs().max().item())
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=12, help="seeds per layout (default 12)")
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
