"""What the scaling study computes from its measurements, and what it predicts without any:
the exponent of a time's growth, where attention's share passes half, each row's peak memory
from its tensors' shapes, and the length at which that prediction reaches a memory limit.

    fit = fit_exponent([1024, 1024, 2048, 2048], [0.10, 0.11, 0.40, 0.41])  # time ∝ S^k
    fit.k, fit.low, fit.high                           # ~2.0 and its 95% interval
    crossing([256, 512, 1024], [0.3, 0.45, 0.6])        # S where the share passes 0.5 (log-interpolated)
    peak = predicted_peak(config, "explicit", "train", batch=8, length=512)
    memory_wall(lambda s: predicted_peak(config, "explicit", "train", 8, s).total, 24 * 2**30)

Prints nothing; the program (``python -m benchmarks.studies.scaling``) reports.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from benchmarks.compare.ratios import CONFIDENCE
from common.config import TransformerConfig

FLOAT = 4  # bytes of a float32 element: every tensor the study's rows run in
BOOL = 1  # bytes of a bool mask element


@dataclass(frozen=True)
class Exponent:
    """time ∝ S^k over some sizes: the least-squares slope of log time on log S."""

    k: float  # the slope
    low: float | None  # its interval at CONFIDENCE (Student's t on the slope's standard error);
    high: float | None  # None with fewer than three points (no degree of freedom left)
    points: int  # (size, time) pairs it stands on: every round's time at every size fitted
    sizes: tuple[int, ...]  # the distinct sizes fitted

    def holds(self, k: float) -> bool:
        """Whether ``k`` lies in the interval (bounds included)."""
        return self.low is not None and self.low <= k <= self.high

    def as_dict(self) -> dict:
        return {"k": self.k, "k_low": self.low, "k_high": self.high, "points": self.points,
                "sizes": list(self.sizes)}


def top_octaves(sizes: Sequence[int], octaves: int) -> list[int]:
    """The distinct sizes within ``octaves`` doublings of the largest: the fit's range."""
    if octaves < 1:
        raise ValueError(f"octaves must be at least 1, got {octaves}")
    largest = max(sizes)
    return sorted({s for s in sizes if s * 2**octaves >= largest})


def fit_exponent(sizes: Sequence[float], seconds: Sequence[float]) -> Exponent | None:
    """The slope k of ``log seconds = k log size + c`` over paired points (each round's time
    at its size, rounds not averaged, so their scatter sets the interval), with a
    ``CONFIDENCE`` interval k ± t(n - 2) · stderr. None with fewer than two distinct sizes or
    a time that is not positive and finite (a failed cell)."""
    x, y = np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"sizes and seconds pair up: got {x.size} sizes and {y.size} times")
    if len(np.unique(x)) < 2 or not (np.all(np.isfinite(y)) and np.all(y > 0) and np.all(x > 0)):
        return None
    fit = stats.linregress(np.log(x), np.log(y))
    distinct = tuple(int(s) for s in np.unique(x))
    if x.size < 3:
        return Exponent(float(fit.slope), None, None, int(x.size), distinct)
    half = stats.t.ppf((1 + CONFIDENCE) / 2, x.size - 2) * fit.stderr
    return Exponent(float(fit.slope), float(fit.slope - half), float(fit.slope + half), int(x.size), distinct)


def crossing(sizes: Sequence[float], shares: Sequence[float], level: float = 0.5) -> float | None:
    """The first size at which ``shares`` (in the order of increasing ``sizes``) reach
    ``level``: interpolated linearly in log size between the last size below and the first at
    or above it; the smallest size when the first share is already there; None when none is."""
    pairs = sorted(zip(sizes, shares, strict=True))
    for i, (size, share) in enumerate(pairs):
        if share >= level:
            if i == 0:
                return float(size)
            (s0, h0), (s1, h1) = pairs[i - 1], (size, share)
            t = (level - h0) / (h1 - h0)
            return float(math.exp(math.log(s0) + t * (math.log(s1) - math.log(s0))))
    return None


# --- peak memory from the tensors' shapes --------------------------------------------------------

# (B, H, S, S) float tensors one attention holds, counted from the code (docs/measuring.md):
# forward, at the softmax of one attention at a time (no_grad keeps nothing between them): the
# teaching rows the scores, the masked scores and the weights; torch's fused eval path the
# scores and the weights; fused's SDPA kernel none
FORWARD_SCORES = {"explicit": 3, "einsum": 3, "mathfirst": 3, "fused": 0, "torch": 2}
# forward: (B, 1, S, S) bytes per element of the mask conversions alive at once: fused's two
# float additive masks and one bool; torch's two bool masks; the teaching rows fill with a bool
# mask freed before their peak
FORWARD_MASK_BYTES = {"explicit": 0, "einsum": 0, "mathfirst": 0, "fused": 2 * FLOAT + BOOL,
                      "torch": 2 * BOOL}
# train: what autograd keeps of every attention until the backward: the weights (softmax's
# output), dropout's mask (a float tensor on the CPU) and its output. Every row: fused and
# torch take SDPA's math path in training (dropout on the CPU), which keeps the same
TRAIN_SCORES_PER_ATTENTION = 3
# train: (B, 1, T, T) bool per decoder layer: the inverted causal mask masked_fill keeps
TRAIN_MASK_BYTES_PER_LAYER = BOOL
# (B, S) floats per token the rest keeps, in units of D and F (d_model, d_ff), per layer:
# forward, the encoder output, the residual stream, a sublayer's input and output, the FFN's
# hidden layer and its activation; train, per encoder layer the saved inputs of the four
# projections, the attention output, two sublayer dropouts (mask and output), two LayerNorms'
# inputs and outputs, the FFN's hidden layer, ReLU output and dropout (mask and output), and
# per decoder layer half as much again for its second attention
FORWARD_PER_TOKEN = (4, 2)  # (xD, xF), once: one layer is live at a time
TRAIN_PER_TOKEN_PER_LAYER = (16 + 24, 4 + 4)  # (xD, xF): encoder + decoder layer
# (B, T, V) float tensors of the generator: forward, the logits and the log-probs; train, the
# log-probs kept for the backward, then their gradient and the logits' at its start
FORWARD_VOCAB, TRAIN_VOCAB = 2, 3


@dataclass(frozen=True)
class PeakBytes:
    """A row's predicted peak memory for one step, in its parts. The activations (scores, masks,
    tokens, vocab) peak as the backward starts, the gradients as it ends, when the activations
    are freed: the step's peak is the larger of the two stages, over the weights."""

    weights: int  # parameters and buffers (compare.py's peaks include them too)
    scores: int  # the (B, H, S, S) tensors: the quadratic term
    masks: int  # the (B, 1, S, S) masks: quadratic too, without the heads
    tokens: int  # per-token activations: linear in B x S
    vocab: int  # the generator's (B, T, V) tensors
    gradients: int = 0  # train: a float32 gradient per parameter, shaped like it; forward: none

    @property
    def activations(self) -> int:
        return self.scores + self.masks + self.tokens + self.vocab

    @property
    def total(self) -> int:
        return self.weights + max(self.activations, self.gradients)

    def as_dict(self) -> dict:
        return {"weights": self.weights, "scores": self.scores, "masks": self.masks,
                "tokens": self.tokens, "vocab": self.vocab, "gradients": self.gradients,
                "total": self.total}


def weight_bytes(config: TransformerConfig) -> int:
    """float32 bytes of the model's parameters (the sinusoid table, a buffer, left out)."""
    d, f, n = config.d_model, config.d_ff, config.n_layers
    attention = 4 * (d * d + d)
    ff = 2 * d * f + f + d
    encoder = n * (attention + ff + 4 * d) + 2 * d
    decoder = n * (2 * attention + ff + 6 * d) + 2 * d
    embeddings = (config.src_vocab_size + config.tgt_vocab_size) * d
    generator = config.tgt_vocab_size * (d + 1)
    return FLOAT * (encoder + decoder + embeddings + generator)


def score_bytes(config: TransformerConfig, batch: float, length: float) -> float:
    """Bytes of one (B, H, S, S) float32 tensor: one attention's scores, or its weights."""
    return batch * config.n_heads * length * length * FLOAT


def predicted_peak(config: TransformerConfig, row: str, phase: str, batch: float, length: float
                   ) -> PeakBytes:
    """The most bytes ``row``'s ``phase`` ("forward": eval under no_grad; "train": forward,
    NLL and backward) holds at once, at ``batch`` sequences of ``length`` source and target
    tokens, from the tensors' shapes: the counts above. ``batch`` may be fractional (a fixed
    number of tokens per batch divided by the length)."""
    if row not in FORWARD_SCORES:
        raise ValueError(f"no memory model for row {row!r}; rows: {sorted(FORWARD_SCORES)}")
    if phase not in ("forward", "train"):
        raise ValueError(f"phase must be 'forward' or 'train', got {phase!r}")
    b, s, n = batch, length, config.n_layers
    d, f, v = config.d_model, config.d_ff, config.tgt_vocab_size
    pairs = b * s * s  # elements of one (B, 1, S, S) tensor
    if phase == "forward":
        scores = FORWARD_SCORES[row] * score_bytes(config, b, s)
        masks = FORWARD_MASK_BYTES[row] * pairs
        tokens = b * s * (FORWARD_PER_TOKEN[0] * d + FORWARD_PER_TOKEN[1] * f) * FLOAT
        vocab = FORWARD_VOCAB * b * s * v * FLOAT
        # the attention and the generator never run at once: the larger stage is the peak
        if vocab > scores + masks + tokens:
            scores = masks = tokens = 0
        else:
            vocab = 0
    else:
        scores = TRAIN_SCORES_PER_ATTENTION * 3 * n * score_bytes(config, b, s)  # 3 attentions a layer
        masks = TRAIN_MASK_BYTES_PER_LAYER * n * pairs
        tokens = n * b * s * (TRAIN_PER_TOKEN_PER_LAYER[0] * d + TRAIN_PER_TOKEN_PER_LAYER[1] * f) * FLOAT
        vocab = TRAIN_VOCAB * b * s * v * FLOAT
    gradients = weight_bytes(config) if phase == "train" else 0
    return PeakBytes(weight_bytes(config), round(scores), round(masks), round(tokens), round(vocab),
                     gradients)


def memory_wall(predict: Callable[[int], float], limit: float, start: int = 1,
                ceiling: int = 2**24) -> int | None:
    """The smallest length S >= ``start`` whose ``predict(S)`` (bytes, growing with S) reaches
    ``limit``: doubling, then bisection. None when even ``ceiling`` stays under it."""
    if predict(start) >= limit:
        return start
    low, high = start, start * 2
    while predict(high) < limit:
        if high >= ceiling:
            return None
        low, high = high, min(high * 2, ceiling)
    while high - low > 1:  # predict(low) < limit <= predict(high)
        middle = (low + high) // 2
        low, high = (middle, high) if predict(middle) < limit else (low, middle)
    return high
