"""Held-out evaluation: a held-out set no training stream draws (``held_out_batch``), the share
of its rows that greedy decoding gets exactly right (``exact_match_accuracy``,
``held_out_accuracy``), and the line the command lines report it in (``accuracy_line``); for
translation, corpus BLEU and chrF of detokenised text against several references each
(``corpus_scores``, through sacreBLEU).

    src, tgt = held_out_batch("copy", 500, vocab_size=10, min_len=1, max_len=8, seed=0)
    accuracy = exact_match_accuracy(model, src, tgt)   # in [0, 1]
    scores = corpus_scores(["Va !"], [["Va !", "Marche."]])  # Scores(bleu=100.0, chrf=100.0, ...)

Decoding runs in eval mode (no dropout) and leaves the model's mode as it found it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from common.masks import padding_mask
from seq2seq.data.ids import BOS_ID, EOS_ID
from seq2seq.data.tasks import TaskData, sample_batch
from seq2seq.search.greedy import greedy_decode

HELD_OUT_SEED_OFFSET = 2**31  # the held-out generator's seed is the training stream's plus this


def held_out_batch(
    task: str, size: int, *, vocab_size: int, min_len: int, max_len: int, seed: int
) -> tuple[Tensor, Tensor]:
    """``size`` (src, tgt) pairs from a generator other than the training stream's of ``seed``.

    Its seed is ``seed + 2**31``: torch's CPU generator keeps only a seed's low 32 bits (so
    ``2**62 + seed`` would replay the training stream), and this offset changes them.
    """
    generator = torch.Generator().manual_seed(seed + HELD_OUT_SEED_OFFSET)
    return sample_batch(task, size, vocab_size=vocab_size, min_len=min_len, max_len=max_len,
                        generator=generator)


def held_out_accuracy(model: nn.Module, data: TaskData, size: int) -> float:
    """``exact_match_accuracy`` on ``size`` held-out pairs of the task ``data`` trains on."""
    src, tgt = held_out_batch(data.task, size, seed=data.seed, **data.shape())
    return exact_match_accuracy(model, src, tgt)


def exact_match_accuracy(model: nn.Module, src: Tensor, tgt: Tensor, batch_size: int = 256) -> float:
    """Share of rows whose greedy decoding equals the target exactly (BOS .. EOS, then padding).

    Decodes in eval mode (no dropout); the model's mode is restored afterwards.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    pad_id, max_len = model.config.pad_id, tgt.shape[1]
    correct = 0
    for first in range(0, src.shape[0], batch_size):
        src_part = src[first:first + batch_size].to(device)
        tgt_part = tgt[first:first + batch_size].to(device)
        decoded = greedy_decode(model, src_part, padding_mask(src_part, pad_id), max_len=max_len,
                                bos_id=BOS_ID, eos_id=EOS_ID)  # (B, L), L <= max_len
        # decoding stops early once every row has ended; the rest is padding
        decoded = nn.functional.pad(decoded, (0, max_len - decoded.shape[1]), value=pad_id)
        correct += int((decoded == tgt_part).all(dim=1).sum())
    model.train(was_training)
    return correct / src.shape[0]


def loss_line(losses: list[float], seconds: float, steps: int | None = None) -> str:
    """The report line of a run's final loss (the mean of its last ten steps) and its time."""
    last = losses[-10:] or [float("nan")]
    done = f"{steps} steps, " if steps is not None else ""
    return (f"final loss {sum(last) / len(last):.4f} (mean of the last {len(last)} steps), "
            f"{done}trained in {seconds:.1f} s")


def accuracy_line(accuracy: float, size: int, task: str) -> str:
    """The held-out report line that ``python -m seq2seq.train`` and ``seq2seq.decode`` print."""
    return (f"held-out exact-sequence accuracy: {accuracy:.1%} "
            f"({round(accuracy * size)}/{size} {task} sequences, greedy)")


# --- translation: corpus BLEU and chrF ------------------------------------------------------


@dataclass(frozen=True)
class Scores:
    """Corpus-level scores of a set of translations, with the sacreBLEU signatures that say how
    they were computed (references per segment, tokenizer, smoothing, version)."""

    bleu: float  # corpus BLEU, 0-100
    chrf: float  # corpus chrF, 0-100
    bleu_signature: str  # e.g. nrefs:var|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0
    chrf_signature: str


def corpus_scores(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> Scores:
    """sacreBLEU's corpus BLEU and chrF of detokenised ``hypotheses``, each against its own
    references (one or more per hypothesis, as many as it has: multi-reference).

    sacreBLEU tokenises itself (13a), so both sides are plain text, as a user reads it.
    """
    if isinstance(hypotheses, str) or not all(isinstance(h, str) for h in hypotheses):
        raise TypeError("hypotheses must be a sequence of str")
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} reference sets")
    if not hypotheses:
        raise ValueError("nothing to score: no hypotheses")
    for index, refs in enumerate(references):
        if isinstance(refs, str) or not refs or not all(isinstance(r, str) for r in refs):
            raise ValueError(f"references[{index}] must be a non-empty sequence of str, got {refs!r}")
    metrics = _sacrebleu_metrics()
    # sacreBLEU reads references as streams (the i-th reference of every segment); a segment
    # with fewer references fills the rest with None, which it skips
    streams = [[refs[i] if i < len(refs) else None for refs in references]
               for i in range(max(len(refs) for refs in references))]
    bleu, chrf = metrics.BLEU(), metrics.CHRF()
    bleu_score = bleu.corpus_score(list(hypotheses), streams)
    chrf_score = chrf.corpus_score(list(hypotheses), streams)
    return Scores(bleu_score.score, chrf_score.score, str(bleu.get_signature()), str(chrf.get_signature()))


def _sacrebleu_metrics():
    """sacrebleu.metrics, or an ImportError saying which extra installs it."""
    try:
        from sacrebleu import metrics
    except ImportError as error:
        raise ImportError('translation scores need sacreBLEU: pip install -e ".[translate]"') from error
    return metrics


def score_lines(scores: dict[int, Scores]) -> list[str]:
    """The report of ``seq2seq.pipeline.evaluate``'s scores: BLEU and chrF per beam size (1 is
    greedy), then the two sacreBLEU signatures."""
    lines = [f"{'greedy' if size == 1 else f'beam {size}':<8} BLEU {s.bleu:5.2f}  chrF {s.chrf:5.2f}"
             for size, s in scores.items()]
    first = next(iter(scores.values()))
    return [*lines, f"BLEU signature: {first.bleu_signature}", f"chrF signature: {first.chrf_signature}"]
