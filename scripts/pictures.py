"""Pictures of two components: the sinusoid table and one layer's attention weights.

    python -m scripts.pictures --out pictures/

writes ``positional_encoding.png`` (the (max_len, d_model) table as a heatmap, as in source 3)
and ``attention_weights.png`` (encoder self-attention of one layer, one panel per head, for a
seeded model and a given source sequence). Needs matplotlib: ``pip install -e ".[plot]"``.

Shape legend:
    S  source length    H  heads    D  model dim (d_model)    L  max_len
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn

from common.cli import Parser, config_or_exit, positive
from common.config import TransformerConfig
from common.masks import padding_mask
from common.positions import sinusoid_table
from variants import build

PE_FILE = "positional_encoding.png"
ATTENTION_FILE = "attention_weights.png"
VOCAB_SIZE = 1000


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, TransformerConfig]:
    """The options and the model's config; a bad value is a one-line usage error (exit 2)."""
    parser = Parser(prog="python -m scripts.pictures", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs (created if needed)")
    parser.add_argument("--d-model", type=int, default=128, help="model width D (default 128)")
    parser.add_argument("--max-len", type=positive(int), default=100,
                        help="positions in the heatmap (default 100)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads H (default 4)")
    parser.add_argument("--layers", type=int, default=2, help="encoder/decoder layers (default 2)")
    parser.add_argument("--layer", type=int, default=0, help="which encoder layer to draw (default 0)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model's weights (default 0)")
    parser.add_argument("--tokens", type=int, nargs="+", metavar="ID",
                        help=f"source token ids in [0, {VOCAB_SIZE}); 0 is padding, masked as a key "
                             "(default: 12 seeded random ids)")
    args = parser.parse_args(argv)
    config = config_or_exit(parser, d_model=args.d_model, n_heads=args.heads, n_layers=args.layers,
                            d_ff=4 * args.d_model, src_vocab_size=VOCAB_SIZE,
                            tgt_vocab_size=VOCAB_SIZE, max_seq_len=args.max_len)
    if not 0 <= args.layer < args.layers:
        parser.error(f"--layer must lie in [0, {args.layers}), got {args.layer}")
    if args.tokens is not None:
        if not all(0 <= t < VOCAB_SIZE for t in args.tokens):
            parser.error(f"--tokens must lie in [0, {VOCAB_SIZE}), got {args.tokens}")
        if len(args.tokens) > args.max_len:
            parser.error(f"--tokens has {len(args.tokens)} ids, more than --max-len {args.max_len}")
    return args, config


class AttentionPicture(NamedTuple):
    """What the attention picture draws."""

    weights: Tensor  # (H, S, S) one layer's self-attention weights, padding keys' columns zero
    tokens: list[int]  # the source ids, which label both axes
    title: str


def attention_picture(config: TransformerConfig, seed: int, tokens: list[int] | None,
                      layer: int) -> AttentionPicture:
    """Encoder layer ``layer``'s self-attention of a mathfirst model seeded with ``seed``, over
    ``tokens`` (None: 12 ids drawn with ``seed``), under the source's padding mask."""
    model = build("mathfirst", config, seed=seed)
    if tokens is None:
        generator = torch.Generator().manual_seed(seed)
        src = torch.randint(1, config.src_vocab_size, (1, 12), generator=generator)  # (1, S)
    else:
        src = torch.tensor([tokens])  # (1, S)
    weights = encoder_attention(model, src, layer)  # (H, S, S)
    return AttentionPicture(weights, src[0].tolist(), f"Encoder layer {layer} self-attention (seed {seed})")


def encoder_attention(model: nn.Module, src: Tensor, layer: int) -> Tensor:
    """(H, S, S) self-attention weights of encoder layer ``layer`` for one sequence ``src`` (1, S).

    ``model`` is a mathfirst model, whose attention modules offer ``attention_map``. A pre-hook
    records the query and key that layer's attention receives, so the picture shows exactly
    what the model computes, in either norm mode.
    """
    attention = model.encoder.layers[layer].self_attn
    calls: list[tuple] = []

    def record_inputs(_module: nn.Module, inputs: tuple) -> None:
        calls.append(inputs)

    handle = attention.register_forward_pre_hook(record_inputs)
    try:
        with torch.no_grad():
            model.eval().encode(src, padding_mask(src, model.config.pad_id))
    finally:
        handle.remove()
    (query, key, _value, mask), = calls
    with torch.no_grad():
        return attention.attention_map(query, key, mask)[0]  # (H, S, S)


def draw_positional_encoding(plt, table: Tensor, path: Path) -> None:
    """The (L, D) sinusoid table as a heatmap, as source 3 draws it."""
    fig, ax = plt.subplots(figsize=(12, 6))
    image = ax.imshow(table.numpy(), cmap="coolwarm_r", aspect="auto", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="Encoding Value")
    ax.set_title("Sinusoidal Positional Encoding", fontsize=18, weight="bold", pad=15)
    ax.set_xlabel("Embedding Dimension", fontsize=13)
    ax.set_ylabel("Position", fontsize=13)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def draw_attention(plt, weights: Tensor, tokens: list[int], title: str, path: Path) -> None:
    """One heatmap panel per head of (H, S, S) attention weights, keys across, queries down."""
    heads = weights.shape[0]
    columns = min(heads, 4)
    rows = math.ceil(heads / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns + 1, 3.2 * rows + 0.6), squeeze=False,
                             layout="constrained")
    labels = [str(t) for t in tokens]
    for head, ax in enumerate(axes.flat):
        if head >= heads:
            ax.axis("off")
            continue
        image = ax.imshow(weights[head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_title(f"head {head}")
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_xlabel("key token")
        if head % columns == 0:
            ax.set_ylabel("query token")
    fig.colorbar(image, ax=axes, label="attention weight", shrink=0.8)
    fig.suptitle(title, fontsize=14)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    """Parse, check for matplotlib, then draw the sinusoid table and one layer's attention."""
    args, config = parse_args(argv)
    try:
        import matplotlib
    except ImportError:
        sys.exit('pictures need matplotlib, which is not installed: pip install -e ".[plot]"')
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args.out.mkdir(parents=True, exist_ok=True)
    draw_positional_encoding(plt, sinusoid_table(args.max_len, args.d_model), args.out / PE_FILE)

    picture = attention_picture(config, args.seed, args.tokens, args.layer)
    draw_attention(plt, picture.weights, picture.tokens, picture.title, args.out / ATTENTION_FILE)


if __name__ == "__main__":
    main()
