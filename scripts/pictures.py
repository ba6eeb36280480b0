"""Pictures of two components: the sinusoid table and one layer's attention weights; and of what
a trained translation model's cross-attention looks at.

    python -m scripts.pictures --out pictures/
    python -m scripts.pictures --translation runs/fr/average.pt --out pictures/ \
        --sentences "The cat sees the house." "I'm hungry."

The first writes ``positional_encoding.png`` (the (max_len, d_model) table as a heatmap, as in
source 3) and ``attention_weights.png`` (encoder self-attention of one layer, one panel per
head, for a seeded model and a given source sequence). The second translates each sentence
(beam 4; ``--beam 1``: greedy) and writes ``cross_attention_1.png``, ... : source pieces across,
the pieces it produced down, one panel per decoder layer with its heads averaged, then one
panel per head of ``--layer`` (default: the last). Needs matplotlib: ``pip install -e ".[plot]"``.

Shape legend:
    S  source length    T  target length    H  heads    N  layers    D  model dim (d_model)
    L  max_len
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn

from common.cli import Parser, config_or_exit, directory_problem, one_line, positive
from common.config import TransformerConfig
from common.masks import decoder_mask, padding_mask
from common.positions import sinusoid_table
from common.weights import transfer
from seq2seq.data.corpus import normalize
from seq2seq.data.ids import BOS_ID, EOS_ID
from seq2seq.data.subwords import Vocabulary
from seq2seq.pipeline import load_translation_model
from seq2seq.search.beam import BEAM_SIZE, EXTRA_LENGTH, beam_search
from seq2seq.search.greedy import greedy_decode
from variants import build

PE_FILE = "positional_encoding.png"
ATTENTION_FILE = "attention_weights.png"
CROSS_ATTENTION_FILE = "cross_attention_{number}.png"  # one per --sentences entry, from 1
VOCAB_SIZE = 1000


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, TransformerConfig | None]:
    """The options and the seeded model's config (None with --translation, whose model is the
    file's); a bad value is a one-line usage error (exit 2)."""
    parser = Parser(prog="python -m scripts.pictures", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs (created if needed)")
    parser.add_argument("--d-model", type=int, default=128, help="model width D (default 128)")
    parser.add_argument("--max-len", type=positive(int), default=100,
                        help="positions in the heatmap (default 100)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads H (default 4)")
    parser.add_argument("--layers", type=int, default=2, help="encoder/decoder layers (default 2)")
    parser.add_argument("--layer", type=int, default=None,
                        help="which encoder layer to draw (default 0); with --translation, the "
                             "decoder layer whose heads are drawn one by one (default: the last)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model's weights (default 0)")
    parser.add_argument("--tokens", type=int, nargs="+", metavar="ID",
                        help=f"source token ids in [0, {VOCAB_SIZE}); 0 is padding, masked as a key "
                             "(default: 12 seeded random ids)")
    translation = parser.add_argument_group("a trained translation model's cross-attention")
    translation.add_argument("--translation", type=Path, default=None, metavar="MODEL",
                             help="a model file of python -m seq2seq.train --task translate (or averaged)")
    translation.add_argument("--sentences", nargs="+", default=None, metavar="TEXT",
                             help="English sentences to translate and draw, one picture each")
    translation.add_argument("--beam", type=positive(int), default=BEAM_SIZE,
                             help=f"beam size of the translation drawn (default {BEAM_SIZE}; 1: greedy)")
    args = parser.parse_args(argv)
    if (args.translation is None) != (args.sentences is None):
        parser.error("--translation MODEL and --sentences TEXT ... go together")
    if problem := directory_problem(args.out):  # before any work, not after it
        parser.error(f"--out {problem}")
    if args.translation is not None:
        return args, None
    args.layer = 0 if args.layer is None else args.layer
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
    (inputs,) = attention_inputs(
        [attention], lambda: model.eval().encode(src, padding_mask(src, model.config.pad_id)))
    query, key, _value, mask = inputs
    with torch.no_grad():
        return attention.attention_map(query, key, mask)[0]  # (H, S, S)


def attention_inputs(modules: list[nn.Module], run) -> list[tuple]:
    """The (query, key, value, mask) each of ``modules`` (mathfirst attentions, called once each)
    receives while ``run()`` runs without grad: read by forward pre-hooks, not recomputed."""
    calls: dict[int, tuple] = {}

    def recorder(index: int):
        return lambda _module, inputs: calls.setdefault(index, inputs)

    handles = [module.register_forward_pre_hook(recorder(index)) for index, module in enumerate(modules)]
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    return [calls[index] for index in range(len(modules))]


class CrossAttention(NamedTuple):
    """What a translation's cross-attention picture draws."""

    weights: Tensor  # (N, H, T, S) each decoder layer's cross-attention; each row sums to 1 over S
    source_pieces: list[str]  # the S source pieces, EOS last: the columns
    target_pieces: list[str]  # the T pieces produced, EOS last if it came: row t produced piece t
    translation: str  # the produced pieces as text


def cross_attention(model: nn.Module, vocabulary: Vocabulary, sentence: str, beam_size: int = BEAM_SIZE,
                    normalization: str = "NFKC") -> CrossAttention:
    """Every decoder layer's cross-attention while ``model`` (any variant) translates ``sentence``.

    The sentence is normalised and translated as ``seq2seq.pipeline.translate`` does it
    (beam search, or greedy for ``beam_size`` 1); the translation is then fed back (BOS and
    the pieces produced, teacher-forced), and each layer's attention weights are read from a
    mathfirst copy of the model (``attention_map``, on the inputs its cross-attention receives).
    Row t is the step that produced piece t: its query sits at the piece before.
    """
    if vocabulary.size != model.config.src_vocab_size or vocabulary.size != model.config.tgt_vocab_size:
        raise ValueError(f"the vocabulary has {vocabulary.size} pieces, the model's vocabularies "
                         f"{model.config.src_vocab_size} and {model.config.tgt_vocab_size}")
    reader = build("mathfirst", model.config)
    transfer(model, reader)
    reader = reader.to(next(model.parameters()).dtype).eval()
    pieces = vocabulary.encode([normalize(sentence, normalization)])[0]
    src = torch.tensor([[*pieces, EOS_ID]])  # (1, S)
    if src.shape[1] > model.config.max_seq_len:
        raise ValueError(f"the sentence is {src.shape[1]} pieces long with EOS; the model reads at most "
                         f"max_seq_len={model.config.max_seq_len}")
    src_mask = padding_mask(src, model.config.pad_id)  # (1, 1, 1, S)
    with torch.no_grad():
        if beam_size == 1:
            max_len = min(model.config.max_seq_len, src.shape[1] + EXTRA_LENGTH + 1)  # BOS included
            tokens = greedy_decode(reader, src, src_mask, max_len=max_len, bos_id=BOS_ID, eos_id=EOS_ID)[0]
        else:
            tokens = beam_search(reader, src, src_mask, bos_id=BOS_ID, eos_id=EOS_ID,
                                 beam_size=beam_size).tokens[0]
    produced = tokens[1:].tolist()  # after BOS: the pieces, EOS, then padding
    produced = produced[:produced.index(EOS_ID) + 1] if EOS_ID in produced else produced
    tgt = tokens[None, :len(produced)]  # (1, T): BOS and every produced piece but the last
    layers = [layer.cross_attn for layer in reader.decoder.layers]
    inputs = attention_inputs(layers, lambda: reader.decode(tgt, reader.encode(src, src_mask), src_mask,
                                                            decoder_mask(tgt, model.config.pad_id)))
    with torch.no_grad():
        weights = torch.stack([attention.attention_map(query, key, mask)[0]
                               for attention, (query, key, _value, mask) in zip(layers, inputs, strict=True)])
    return CrossAttention(weights, vocabulary.pieces(src[0].tolist()), vocabulary.pieces(produced),
                          vocabulary.decode([produced])[0])  # weights: (N, H, T, S)


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


def draw_cross_attention(plt, picture: CrossAttention, layer: int, title: str, path: Path) -> None:
    """Source pieces across, produced pieces down: one panel per decoder layer with its heads
    averaged (top row), then one per head of decoder layer ``layer`` (bottom row)."""
    layers, heads = picture.weights.shape[:2]
    columns = max(layers, heads)
    rows, sources = len(picture.target_pieces), len(picture.source_pieces)
    panel = (0.9 + 0.28 * sources, 0.9 + 0.28 * rows)  # inches: room for one label per piece
    fig, axes = plt.subplots(2, columns, squeeze=False, layout="constrained",
                             figsize=(panel[0] * columns + 1.2, 2 * panel[1] + 0.8))
    panels = [(picture.weights[n].mean(dim=0), f"layer {n}, heads averaged") for n in range(layers)]
    panels += [(None, "")] * (columns - layers)
    panels += [(picture.weights[layer, h], f"layer {layer}, head {h}") for h in range(heads)]
    panels += [(None, "")] * (columns - heads)
    top = float(picture.weights.max())  # one colour scale for every panel, up to the largest weight
    for (weights, name), ax in zip(panels, axes.flat, strict=True):
        if weights is None:
            ax.axis("off")
            continue
        image = ax.imshow(weights.numpy(), cmap="viridis", vmin=0.0, vmax=top)  # (T, S)
        ax.set_title(name, fontsize=9)
        ax.set_xticks(range(sources), picture.source_pieces, rotation=90, fontsize=7)
        ax.set_yticks(range(rows), picture.target_pieces, fontsize=7)
    fig.colorbar(image, ax=axes, label="attention weight", shrink=0.6)
    fig.suptitle(title, fontsize=11)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def translation_pictures(args: argparse.Namespace) -> tuple[int, list[CrossAttention]]:
    """The decoder layer whose heads are drawn, and each sentence's cross-attention, from the
    model file; a file that is not a translation model, a --layer it lacks or a sentence too
    long for it ends the program in one line."""
    try:
        _, vocabulary, model, normalization = load_translation_model(args.translation)
    except (FileNotFoundError, LookupError, ValueError) as error:
        sys.exit(f"python -m scripts.pictures: error: {one_line(error)}")
    layers = model.config.n_layers
    layer = layers - 1 if args.layer is None else args.layer
    if not 0 <= layer < layers:
        sys.exit(f"python -m scripts.pictures: error: --layer must lie in [0, {layers}) for "
                 f"{args.translation}, got {layer}")
    found = []
    for number, sentence in enumerate(args.sentences, start=1):
        try:
            found.append(cross_attention(model, vocabulary, sentence, args.beam, normalization))
        except ValueError as error:  # a sentence longer than the model reads
            sys.exit(f"python -m scripts.pictures: error: sentence {number}: {one_line(error)}")
    return layer, found


def main(argv: list[str] | None = None) -> None:
    """Parse, check for matplotlib, then draw the sinusoid table and one layer's attention, or
    with --translation each sentence's cross-attention."""
    args, config = parse_args(argv)
    # a model file is read (and refused) before matplotlib loads
    translation = translation_pictures(args) if args.translation is not None else None
    try:
        import matplotlib
    except ImportError:
        sys.exit('pictures need matplotlib, which is not installed: pip install -e ".[plot]"')
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args.out.mkdir(parents=True, exist_ok=True)
    if translation is not None:
        layer, found = translation
        how = "greedy" if args.beam == 1 else f"beam {args.beam}"
        for number, (sentence, picture) in enumerate(zip(args.sentences, found, strict=True), start=1):
            draw_cross_attention(plt, picture, layer, f"{sentence} -> {picture.translation} ({how})",
                                 args.out / CROSS_ATTENTION_FILE.format(number=number))
        return
    draw_positional_encoding(plt, sinusoid_table(args.max_len, args.d_model), args.out / PE_FILE)

    picture = attention_picture(config, args.seed, args.tokens, args.layer)
    draw_attention(plt, picture.weights, picture.tokens, picture.title, args.out / ATTENTION_FILE)


if __name__ == "__main__":
    main()
