"""Follow one forward pass of a variant, module by module, with the shape each one returns.

    python -m scripts.trace --variant einsum            # every module call, in call order
    python -m scripts.trace --variant mathfirst --depth 3

A reading aid: run it next to the variant's source to see which module runs when, and what it
hands on. Shapes use the README's legend (B=2, S=5, T=4 by default, D=d_model, V=vocabulary).
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from common.cli import Parser, positive
from common.config import TransformerConfig
from common.random_batch import random_batch
from variants import VARIANTS, build


def trace(model: nn.Module, inputs: tuple[torch.Tensor, ...], depth: int) -> list[str]:
    """One line per module call of ``model(*inputs)`` (up to ``depth`` levels below the model),
    in call order."""
    lines: list[str] = []
    open_calls: list[tuple[int, str]] = []  # (line index, name) of the modules still running

    def enter(name: str):
        def hook(_module, _inputs) -> None:
            open_calls.append((len(lines), name))
            lines.append("")
        return hook

    def leave(name: str):
        def hook(_module, _inputs, output) -> None:
            index, _ = open_calls.pop()
            shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
            indent = "  " * len(open_calls)
            lines[index] = f"{indent}{name:<{52 - len(indent)}} -> {shape}"
        return hook

    modules = [(name, module) for name, module in model.named_modules()
               if name and name.count(".") < depth]
    handles = [module.register_forward_pre_hook(enter(name)) for name, module in modules]
    handles += [module.register_forward_hook(leave(name)) for name, module in modules]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m scripts.trace", description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=VARIANTS, default="explicit")
    parser.add_argument("--depth", type=positive(int), default=4, help="module levels to show (default 4)")
    args = parser.parse_args(argv)
    config = TransformerConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, src_vocab_size=11,
                               tgt_vocab_size=13, max_seq_len=8)
    model = build(args.variant, config, seed=0).eval()
    inputs = random_batch(config, batch=2, src_len=5, tgt_len=4, seed=0).inputs()
    print(f"{args.variant}: B=2, S=5, T=4, D={config.d_model}, H={config.n_heads}, "
          f"V_src={config.src_vocab_size}, V_tgt={config.tgt_vocab_size}; "
          "each module with the shape it returned, children indented under their caller")
    print("\n".join(trace(model, inputs, args.depth)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
