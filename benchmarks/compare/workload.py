"""What every row runs: the model presets, the block's shape and dtype, and its FLOP count."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from common.config import MODEL_PRESETS, TransformerConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Preset(NamedTuple):
    """A model size and the batch shape it is timed at by default."""

    fields: dict  # TransformerConfig fields; empty = the paper's base model, untied
    batch: int  # default batch size
    length: int  # default source (and target) length


TIMING_PRESETS: dict[str, Preset] = {
    "tiny": Preset(dict(d_model=64, n_heads=4, n_layers=2, d_ff=256, src_vocab_size=1000,
                        tgt_vocab_size=1000, max_seq_len=128), 4, 16),
    "small": Preset(dict(d_model=256, n_heads=8, n_layers=3, d_ff=1024, src_vocab_size=8000,
                         tgt_vocab_size=8000, max_seq_len=256), 8, 64),
    "base": Preset(dict(), 8, 128),
    # the paper's Table 3 models as common.config names them: paper-base, paper-big (tied)
    **{name: Preset(dataclasses.asdict(config), 8, 128) for name, config in MODEL_PRESETS.items()},
    # Helsinki-NLP opus-mt-* base as Hugging Face's MarianMTModel runs it (docs/real-checkpoints.md):
    # one shared vocabulary of 58,101 ids, tied, swish, Marian's positions, no final norms. Padding
    # stays id 0 and decoding starts from BOS, as in every timing row (the ids cost nothing)
    "opus-mt-base": Preset(dict(src_vocab_size=58101, tgt_vocab_size=58101, share_embeddings=True,
                                activation="silu", final_norm=False, positions="marian", norm_eps=1e-5),
                           8, 128),
}


class Shape(NamedTuple):
    """One block's batch shape."""

    batch: int
    src_len: int
    tgt_len: int


def paired_shapes(batches: list[int], src_lens: list[int], tgt_lens: list[int]) -> tuple[Shape, ...]:
    """The i-th batch with the i-th lengths; a single value pairs with every shape."""
    counts = {len(values) for values in (batches, src_lens, tgt_lens)} - {1}
    if len(counts) > 1:
        raise ValueError("--batch, --src-len and --tgt-len pair up: give each one value or the same "
                         "number of values")
    n_shapes = max(counts, default=1)
    columns = (values * n_shapes if len(values) == 1 else values for values in (batches, src_lens, tgt_lens))
    return tuple(Shape(*shape) for shape in zip(*columns, strict=True))


def check_lengths(config: TransformerConfig, shapes: tuple[Shape, ...], decode_len: int) -> None:
    """ValueError naming the longest length, or the decode length, over ``config.max_seq_len``."""
    longest = max(n for shape in shapes for n in shape[1:])
    for name, length in (("length", longest), ("--decode-len", decode_len)):
        if length > config.max_seq_len:
            raise ValueError(f"{name} {length} exceeds max_seq_len {config.max_seq_len}; "
                             "raise it with --max-seq-len")


def forward_flops(config: TransformerConfig, batch: int, src_len: int, tgt_len: int) -> int:
    """Matrix-multiply FLOPs of one forward pass (2 per multiply-add), the same for every row.

    Per layer, with S source and T target positions, D = d_model, F = d_ff, V = tgt vocab:
      encoder:  8SD^2 (Q, K, V, O) + 4S^2 D (QK^T, AV) + 4SDF (FFN)
      decoder:  8TD^2 + 4T^2 D (self)  +  4TD^2 + 4SD^2 + 4TSD (cross)  +  4TDF (FFN)
      generator: 2TDV once.
    Causal attention is counted in full (every variant computes the whole T x T matrix).
    Left out, as elementwise work beside the matmuls: softmax, LayerNorm, dropout, ReLU, the
    embedding lookup and its scaling, the positional encodings, bias and residual adds, and the
    loss. ``torch.utils.flop_counter.FlopCounterMode`` counts exactly this in every row.
    """
    c = config
    d, f, n = c.d_model, c.d_ff, c.n_layers
    s, t = src_len, tgt_len
    encoder = 8 * s * d * d + 4 * s * s * d + 4 * s * d * f
    decoder = (8 * t * d * d + 4 * t * t * d) + (4 * t * d * d + 4 * s * d * d + 4 * t * s * d) \
        + 4 * t * d * f
    return batch * (n * (encoder + decoder) + 2 * t * d * c.tgt_vocab_size)


def train_flops(config: TransformerConfig, batch: int, src_len: int, tgt_len: int) -> int:
    """FLOPs of forward + backward: 3x ``forward_flops``. The backward of each matmul is two of
    the same size, one for the gradient of each operand (every operand needs one: weights are
    trained, and even the first layer's input leads back to the trained embeddings). The
    optimiser step is not counted, nor is the QKᵀ that a fused attention kernel's backward
    recomputes (SDPA's: the computation's matmuls are counted, not a kernel's schedule)."""
    return 3 * forward_flops(config, batch, src_len, tgt_len)


def gemm_shapes(config: TransformerConfig, shape: Shape, device: str) -> list[tuple[int, int, int]]:
    """The (M, K, N) of the matmuls a step of this block runs, then one large square (8192 on
    CUDA, 2048 on CPU): the candidates for the matmul peak. With D = d_model, F = d_ff,
    V = tgt vocab: the projections (tokens x D x D), the feed-forward's two halves
    (tokens x D x F, tokens x F x D) over the source tokens, the generator (target tokens x D x V).
    """
    d, f, v = config.d_model, config.d_ff, config.tgt_vocab_size
    src_tokens, tgt_tokens = shape.batch * shape.src_len, shape.batch * shape.tgt_len
    square = 8192 if device == "cuda" else 2048
    shapes = [(src_tokens, d, d), (src_tokens, d, f), (src_tokens, f, d), (tgt_tokens, d, v),
              (square, square, square)]
    return list(dict.fromkeys(shapes))  # in order, once each


MACHINE_BALANCE = 100  # FLOP per byte a data-centre GPU's 16-bit tensor cores need to stay busy


def small_shape_warning(config: TransformerConfig, shape: Shape, dtype: torch.dtype) -> str | None:
    """On CUDA, why this shape cannot be compute-bound, or None.

    The main GEMMs multiply M = batch x (the shorter length) token rows by D x D weights
    (D = d_model):
    2·M·D² FLOPs over (2·M·D + D²) elements read and written, so
    M·D² · 2 / ((2·M·D + D²) · bytes per element) FLOP per byte. Below MACHINE_BALANCE (about
    an H100/H200's dense 16-bit peak over its memory bandwidth) a step waits on memory and on
    kernel launches, and its time says little about the arithmetic.
    """
    rows, d = shape.batch * min(shape.src_len, shape.tgt_len), config.d_model
    intensity = 2 * rows * d * d / ((2 * rows * d + d * d) * dtype.itemsize)
    if intensity >= MACHINE_BALANCE:
        return None
    return (f"batch {shape.batch} x {min(shape.src_len, shape.tgt_len)} tokens at d_model {d} in "
            f"{str(dtype).removeprefix('torch.')} gives the main GEMMs {intensity:.0f} FLOP/byte, "
            f"under the ~{MACHINE_BALANCE} a GPU needs to be compute-bound: this measures memory "
            f"and launch overhead more than arithmetic (raise --batch or the lengths)")
