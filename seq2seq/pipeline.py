"""Real translation with any variant: a corpus and its subword vocabulary become a seeded,
resumable stream of token-counted batches; a run trains for N steps or M minutes; a model
translates text (greedy or beam) and is scored with corpus BLEU and chrF against every
reference.

    settings = TRAINING_PRESETS["cpu"]
    corpus = load_corpus(CorpusSettings("fra-eng.zip"))                       # seq2seq.data.corpus
    vocabulary = train_vocabulary(training_sentences(corpus), settings.vocabulary_settings())
    data = TranslationData(CorpusSettings("fra-eng.zip"), settings.vocabulary_settings(),
                           settings.batch_tokens, settings.pool_size, seed=0)
    batches = TokenBatches(encode_pairs(vocabulary, corpus.pairs("train")), data)
    model = build("explicit", settings.config(), seed=0)
    trainer = Trainer(model, batches, settings.recipe())
    train_translation(trainer, settings)                     # up to settings.steps / .minutes
    translate_sentences(model, vocabulary, ["I'm hungry."], beam_size=4)        # ["J'ai faim."]
    evaluate(model, vocabulary, corpus.test)                 # {1: Scores(...), 4: Scores(...)}

The batches (``TranslationData``, ``encode_pairs``, ``TokenBatches``) are
``seq2seq.data.batches``'. A source is its pieces then EOS; a target is BOS, its pieces, EOS
(``seq2seq.data.ids``). Source and target share one joint vocabulary, so the model ties its
three embedding matrices by default (``share_embeddings``, paper section 3.4). Prints nothing:
``python -m seq2seq.train --task translate`` and ``python -m seq2seq.translate`` are the command
lines over this.

Shape legend:
    B  sentences (batch)   S  source length   T  target length (BOS and EOS included)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TextIO

import torch
from torch import Tensor, nn
from tqdm import tqdm

from common.checks import check_int, check_number
from common.cli import one_line
from common.config import TransformerConfig
from common.masks import decoder_mask, padding_mask
from seq2seq.data.batches import (
    EncodedPairs,
    TokenBatches,
    TranslationData,
    batches_by_length,
    encode_pairs,
    within,
)
from seq2seq.data.corpus import ATTRIBUTION, Corpus, CorpusSettings, Example, load_corpus, normalize
from seq2seq.data.ids import PAD_ID
from seq2seq.data.subwords import Vocabulary, VocabularySettings, train_vocabulary
from seq2seq.evaluation import Scores, corpus_scores, loss_line, score_lines
from seq2seq.hub.tokenizers import FairseqTokenizer, MarianTokenizer, tokenizer_from_record
from seq2seq.search.beam import ALPHA, EXTRA_LENGTH, beam_search
from seq2seq.search.greedy import greedy_decode
from seq2seq.storage.model_file import ModelFile, build_model, load
from seq2seq.training import distributed
from seq2seq.training.distributed import SINGLE, World
from seq2seq.training.recipe import Recipe, StepReport, smoothed_loss_sum
from seq2seq.training.run import RunError, RunSettings, header, newest_checkpoint, run_with_checkpoints, start
from seq2seq.training.trainer import Trainer

# --- settings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TranslationSettings:
    """A translation model, its vocabulary, its batches and its training run: what a preset fixes."""

    vocabulary_size: int = 8000  # joint subword pieces, PAD/BOS/EOS/UNK included
    vocabulary_type: str = "bpe"  # sentencepiece "bpe" or "unigram"
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 3  # encoder layers, and as many decoder layers
    d_ff: int = 1024
    dropout: float = 0.1
    norm_first: bool = False  # pre-norm instead of the paper's post-norm
    # a LayerNorm after each stack, as torch.nn.Transformer has; False: none, as the paper's
    # post-norm model and Marian (python -m seq2seq.export_hf needs False)
    final_norm: bool = True
    norm_eps: float = 1e-6  # LayerNorm's eps (Marian's, for export: 1e-5)
    share_embeddings: bool = True  # one matrix for both embeddings and the generator
    max_seq_len: int = 256  # positions, BOS and EOS included: the longest sentence it can read or write
    batch_tokens: int = 4096  # source + target positions per step, padding included
    pool_size: int = 8192  # pairs drawn per step, sorted by length, from which one batch is cut
    warmup: int = 400  # steps of linear warm-up
    lr_factor: float = 1.0  # scales the schedule factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    label_smoothing: float = 0.1
    steps: int = 100_000  # optimiser steps in all (a resumed run continues up to this many)
    minutes: float | None = None  # stop at the first step that ends past this much training time
    eval_every: int = 500  # steps between validation reports (the command line's)

    def __post_init__(self) -> None:
        for name in ("batch_tokens", "pool_size", "steps", "eval_every", "max_seq_len"):
            check_int(f"TranslationSettings.{name}", getattr(self, name), low=1)
        if self.minutes is not None:
            check_number("TranslationSettings.minutes", self.minutes)
        self.vocabulary_settings()  # each owner checks its own fields
        self.recipe()

    def vocabulary_settings(self) -> VocabularySettings:
        return VocabularySettings(self.vocabulary_size, self.vocabulary_type)

    def recipe(self) -> Recipe:
        return Recipe(warmup=self.warmup, lr_factor=self.lr_factor, label_smoothing=self.label_smoothing)

    def config(self) -> TransformerConfig:
        """The model's config: both sides share the joint vocabulary of ``vocabulary_size``
        pieces (sentencepiece trains exactly that many)."""
        return TransformerConfig(
            d_model=self.d_model, n_heads=self.n_heads, n_layers=self.n_layers, d_ff=self.d_ff,
            dropout=self.dropout, src_vocab_size=self.vocabulary_size, tgt_vocab_size=self.vocabulary_size,
            max_seq_len=self.max_seq_len, norm_first=self.norm_first, pad_id=PAD_ID,
            share_embeddings=self.share_embeddings, final_norm=self.final_norm, norm_eps=self.norm_eps)

    def replace(self, **changes: object) -> TranslationSettings:
        return dataclasses.replace(self, **changes)


TRAINING_PRESETS: dict[str, TranslationSettings] = {
    # a 2-core CPU: a small model, a 4k vocabulary (a cheaper generator and softmax), batches of
    # two thousand tokens, a high peak rate, half an hour of training; no dropout, since half an
    # hour is a few passes over the pairs, too few to overfit, and drawing its masks costs time
    "cpu": TranslationSettings(vocabulary_size=4000, d_model=256, n_heads=4, n_layers=3, d_ff=1024,
                               dropout=0.0, batch_tokens=2048, warmup=400, lr_factor=0.7,
                               minutes=30.0, eval_every=500),
    # one GPU: the paper's base model, more regularised for a corpus of this size
    "gpu": TranslationSettings(vocabulary_size=8000, d_model=512, n_heads=8, n_layers=6, d_ff=2048,
                               dropout=0.2, batch_tokens=16384, warmup=2000, lr_factor=1.0,
                               steps=20_000, minutes=None, eval_every=1000),
}


def training_sentences(corpus: Corpus) -> Iterator[str]:
    """What the vocabulary is trained on: the train split only, each source once and each of
    its translations (so nothing of valid or test shapes the pieces)."""
    for example in corpus.train:
        yield example.source
        yield from example.references


# --- training ------------------------------------------------------------------------------


class _OutOfMinutesError(Exception):
    """Raised from the step callback to end a run that has used its minutes."""


def train_translation(trainer: Trainer, settings: TranslationSettings,
                      on_step: Callable[[StepReport], None] | None = None,
                      clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Train up to ``settings.steps`` steps in all, or until ``settings.minutes`` of training
    have passed (the first step ending past it is the last); returns each step's loss.

    The minutes count training time since this call, read on ``clock`` (seconds): time spent
    inside ``on_step`` (validation, checkpoints) is not counted, and the reports ``on_step``
    gets count their seconds alike. Under several processes they all stop at the same step
    (rank 0's clock decides).
    """
    losses: list[float] = []
    start, outside = clock(), 0.0  # outside: seconds spent in on_step

    def step(report: StepReport) -> None:
        nonlocal outside
        losses.append(report.loss)
        training = clock() - start - outside
        if on_step is not None:
            entered = clock()
            on_step(dataclasses.replace(report, seconds=training))
            outside += clock() - entered
        if settings.minutes is not None:
            over = torch.tensor([float(training >= settings.minutes * 60)])
            if trainer.world.size > 1:  # rank 0's decision, on the device the group talks on
                over = over.to(trainer.device) * float(trainer.world.is_main)
            if float(distributed.sum_over_ranks(over, trainer.world)) > 0:
                raise _OutOfMinutesError

    with contextlib.suppress(_OutOfMinutesError):
        trainer.run(settings.steps, on_step=step)
    return losses


@torch.no_grad()
def validation_loss(model: nn.Module, encoded: EncodedPairs, batch_tokens: int = 4096) -> float:
    """Teacher-forced cross-entropy per target token (no label smoothing) over every pair, in
    eval mode (the model's mode is restored)."""
    check_int("batch_tokens", batch_tokens, low=1)
    if not encoded.sources:
        raise ValueError("validation_loss: no pairs to score")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    pad_id = model.config.pad_id
    total, tokens = 0.0, 0
    for src, tgt in batches_by_length(encoded, batch_tokens):
        src, tgt = src.to(device), tgt.to(device)
        tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]  # (B, T - 1) each
        log_probs = model(src, tgt_in, padding_mask(src, pad_id), decoder_mask(tgt_in, pad_id))
        loss_sum, count = smoothed_loss_sum(log_probs.float(), tgt_out, pad_id, 0.0)
        total, tokens = total + float(loss_sum), tokens + int(count)
    model.train(was_training)
    return total / tokens


# --- translating and scoring ---------------------------------------------------------------


class TranslationModel(NamedTuple):
    """A translation model file, read: what translating with it needs."""

    record: ModelFile  # the file as read
    # the subword vocabulary stored in it, or a converted checkpoint's own tokenizer (seq2seq.hub)
    vocabulary: Vocabulary | MarianTokenizer | FairseqTokenizer
    model: nn.Module  # its weights in the chosen variant
    # the Unicode form its corpus was put in (NFKC for files that do not say); None for a
    # converted checkpoint, whose tokenizer normalises text its own way
    normalization: str | None


def load_translation_model(path: str | os.PathLike, variant: str | None = None) -> TranslationModel:
    """Read a model file of a translation run and build ``variant`` (default: the one that
    trained) around its weights; a file without a vocabulary or tokenizer is a ``ValueError``
    saying so (and ``load``'s and ``build``'s errors pass through: FileNotFoundError, ValueError,
    LookupError). A converted checkpoint (``python -m seq2seq.convert``) carries its own tokenizer."""
    record = load(path)
    if record.tokenizer is not None:
        tokenizer = tokenizer_from_record(record.tokenizer)
        return TranslationModel(record, tokenizer, build_model(record, variant), None)
    if record.vocabulary is None:
        raise ValueError(f"{path} holds no subword vocabulary: it is not a translation model "
                         "(python -m seq2seq.train --task translate writes them)")
    normalization = record.settings.get("data", {}).get("corpus", {}).get("normalization", "NFKC")
    return TranslationModel(record, Vocabulary.from_tensor(record.vocabulary),
                            build_model(record, variant), normalization)


@torch.no_grad()
def translate_sentences(model: nn.Module, vocabulary: Vocabulary | MarianTokenizer | FairseqTokenizer,
                        sentences: Sequence[str], *, beam_size: int = 1, alpha: float = ALPHA,
                        batch_size: int = 64, normalization: str | None = "NFKC",
                        search: Callable[[Tensor, Tensor], Tensor] | None = None,
                        banned_ids: tuple[int, ...] = ()) -> list[str]:
    """The model's translation of each sentence, detokenised: greedy decoding for
    ``beam_size=1``, else beam search (``seq2seq.search.beam``, length penalty ``alpha``); or
    ``search``, a decoder of one's own taking the (B, S) source ids and their mask to (B, L)
    ids from the start id (``seq2seq.fast.static_search``'s decoders, built for this model and
    vocabulary, with the same ``banned_ids``), in place of both. ``banned_ids`` (a model file's)
    are never generated (``seq2seq.search.strategy.apply_ban``).

    Each sentence is normalised as the corpus was (``normalization``; None: left to the
    tokenizer, as a converted checkpoint's does) and may produce up to its length + 50 pieces
    (section 6.1), within the model's ``max_seq_len``; one that is empty after normalisation (or
    blank) translates to "". The special ids are the vocabulary's: a source ends in its
    ``eos_id``, padding is its ``pad_id`` and the decoder starts with its ``start_id``. Runs in eval mode
    (the model's mode is restored) on the model's device, ``batch_size`` sentences at a time,
    shortest first.
    """
    if isinstance(sentences, str) or not all(isinstance(s, str) for s in sentences):
        raise TypeError("sentences must be a sequence of str")
    check_int("beam_size", beam_size, low=1)
    check_int("batch_size", batch_size, low=1)
    config = model.config
    sizes = (vocabulary.source_size, vocabulary.target_size)
    if sizes != (config.src_vocab_size, config.tgt_vocab_size):
        pieces = f"{sizes[0]}" if sizes[0] == sizes[1] else f"{sizes[0]} source and {sizes[1]} target"
        raise ValueError(f"the vocabulary has {pieces} pieces, the model's vocabularies "
                         f"{config.src_vocab_size} and {config.tgt_vocab_size}")
    pad_id, eos_id, start_id = vocabulary.pad_id, vocabulary.eos_id, vocabulary.start_id
    texts = [s if normalization is None else normalize(s, normalization) for s in sentences]
    sources = [[*ids, eos_id] for ids in vocabulary.encode(texts)]
    for index, ids in enumerate(sources):
        if len(ids) > config.max_seq_len:
            raise ValueError(f"sentence {index} is {len(ids)} pieces long with EOS; the model reads "
                             f"at most max_seq_len={config.max_seq_len}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    # a blank sentence translates to a blank line, without the model
    present = [bool(text.strip() if normalization is None else text) for text in texts]
    order = sorted((i for i in range(len(sources)) if present[i]), key=lambda i: len(sources[i]))
    output: list[str] = [""] * len(sources)
    for first in range(0, len(order), batch_size):
        rows = order[first:first + batch_size]
        src = nn.utils.rnn.pad_sequence([torch.tensor(sources[i]) for i in rows], batch_first=True,
                                        padding_value=pad_id).to(device)  # (B, S)
        src_mask = padding_mask(src, pad_id)  # (B, 1, 1, S)
        if search is not None:
            tokens = search(src, src_mask)
        elif beam_size == 1:
            max_len = min(config.max_seq_len, src.shape[1] + EXTRA_LENGTH + 1)  # the start id included
            tokens = greedy_decode(model, src, src_mask, max_len=max_len, bos_id=start_id, eos_id=eos_id,
                                   banned_ids=banned_ids)
        else:
            tokens = beam_search(model, src, src_mask, bos_id=start_id, eos_id=eos_id,
                                 beam_size=beam_size, alpha=alpha, banned_ids=banned_ids).tokens
        for row, text in zip(rows, vocabulary.decode(tokens.tolist()), strict=True):
            output[row] = text
    model.train(was_training)
    return output


def evaluate(model: nn.Module, vocabulary: Vocabulary, examples: Sequence[Example], *,
             beam_sizes: Sequence[int] = (1, 4), alpha: float = ALPHA, batch_size: int = 64,
             normalization: str = "NFKC", banned_ids: tuple[int, ...] = ()) -> dict[int, Scores]:
    """Corpus BLEU and chrF of the model's translations of ``examples``' sources against all
    their references, for each beam size (1: greedy), keyed by beam size; ``banned_ids`` never
    generated."""
    if not examples:
        raise ValueError("no examples to evaluate")
    sources = [example.source for example in examples]
    references = [example.references for example in examples]
    return {size: corpus_scores(translate_sentences(model, vocabulary, sources, beam_size=size, alpha=alpha,
                                          batch_size=batch_size, normalization=normalization,
                                          banned_ids=banned_ids),
                                references)
            for size in beam_sizes}


# --- the run of python -m seq2seq.train --task translate -----------------------------------


def budget_words(minutes: float | None) -> str:
    """What the run's first line says of its time budget: "" without one."""
    if not minutes:
        return ""
    return (f" (at most {minutes:g} minute{'' if minutes == 1 else 's'} of training; the test split's "
            "scoring, greedy and beam 4, follows outside it)")


def score_test_split(model: nn.Module, vocabulary: Vocabulary, examples: Sequence[Example],
                     normalization: str, progress: TextIO | None,
                     beam_sizes: Sequence[int] = (1, 4)) -> dict[int, Scores]:
    """``evaluate`` of the test split, each beam size a phase of its own bar on ``progress``
    (None: no bar): after training, outside its minutes, so a run shows what it is doing."""
    scores = {}
    with tqdm(total=len(examples) * len(beam_sizes), unit="sentence", file=progress, disable=progress is None,
              leave=False) as bar:
        for size in beam_sizes:
            bar.set_description(f"scoring the test split, {'greedy' if size == 1 else f'beam {size}'}")
            scores |= evaluate(model, vocabulary, examples, beam_sizes=(size,), normalization=normalization)
            bar.update(len(examples))
    return scores


def run_translation(run: RunSettings, settings: TranslationSettings, corpus_settings: CorpusSettings,
                    config: TransformerConfig, *, world: World = SINGLE, device: torch.device | None = None,
                    progress: TextIO | None = None, note: Callable[[str], None] | None = None) -> list[str]:
    """Load the corpus; train its vocabulary (or take the checkpoint's, resuming); train with
    validation every ``settings.eval_every`` steps; return the report, on rank 0: the final loss
    and the test split's BLEU and chrF, greedy and beam 4 (other ranks get no lines).

    ``progress``: the stream of the bar (rank 0); ``note``: the run's remarks (its first line,
    pairs left out, each validation). Data the run cannot use (a bad corpus, a vocabulary it
    cannot fill, no train pair within ``max_seq_len``), or a checkpoint it cannot resume from,
    raise ``RunError`` before any training, and before ``run.overwrite`` deletes anything.
    """
    def remark(line: str) -> None:
        if note is not None and world.is_main:
            note(line)

    # 1. the corpus and its vocabulary: the checkpoint's when resuming (the model's ids mean its pieces)
    try:
        corpus = load_corpus(corpus_settings)
    except ValueError as error:
        raise RunError(one_line(error)) from error
    newest = newest_checkpoint(run) if run.resume else None
    if newest is not None:
        try:
            if newest[1].vocabulary is None:
                raise ValueError("it holds no subword vocabulary (not a translation run)")
            vocabulary = Vocabulary.from_tensor(newest[1].vocabulary)
        except ValueError as error:
            raise RunError(f"cannot resume from {newest[0]}: {one_line(error)}") from error
    else:
        try:  # e.g. a vocabulary larger than a small corpus can fill
            vocabulary = train_vocabulary(training_sentences(corpus), settings.vocabulary_settings())
        except ValueError as error:
            raise RunError(f"{one_line(error)}; a smaller --vocab, or a larger corpus") from error

    # 2. the pairs: sources it will translate must fit the model; longer pairs are left out of training
    max_len = settings.max_seq_len
    for name in ("valid", "test"):
        sources = vocabulary.encode([example.source for example in corpus.split(name)])
        if (longest := max(len(ids) + 1 for ids in sources)) > max_len:
            raise RunError(f"a {name} sentence is {longest} pieces long with EOS, more than the model's "
                           f"max_seq_len {max_len}: a smaller --max-words")
    data = TranslationData(corpus_settings, settings.vocabulary_settings(), settings.batch_tokens,
                           settings.pool_size, run.seed)
    try:
        train, long_train = within(encode_pairs(vocabulary, corpus.pairs("train")), max_len)
        if not train.sources:
            raise ValueError(f"all {long_train} train pairs are longer than max_seq_len={max_len} "
                             "(source or target, BOS and EOS included): nothing left to train on")
        batches = TokenBatches(train, data)
    except ValueError as error:
        raise RunError(one_line(error)) from error
    valid, long_valid = within(encode_pairs(vocabulary, corpus.pairs("valid")), max_len)

    # 3. the model, fresh or resumed, and the run with validation
    trainer = start(run, batches, config, settings.recipe(), world=world, device=device, newest=newest)
    limit = budget_words(settings.minutes)
    remark(header(run, trainer, f"translate {Path(corpus_settings.path).name}, {len(corpus.train):,} train / "
                                f"{len(corpus.valid):,} valid / {len(corpus.test):,} test English sentences, "
                                f"{vocabulary.size} subwords, {settings.steps} steps{limit} of "
                                f"{settings.batch_tokens} tokens"))
    if long := long_train + long_valid:
        remark(f"{long} train or valid pairs longer than max_seq_len {max_len} left out of training and "
               "validation loss (the test scores keep every reference)")
    normalization = corpus_settings.normalization

    def validate(report: StepReport) -> None:
        if report.step % settings.eval_every == 0 and valid.sources:
            loss = validation_loss(trainer.model, valid, settings.batch_tokens)
            scores = evaluate(trainer.model, vocabulary, corpus.valid, beam_sizes=(1,),
                              normalization=normalization)[1]
            remark(f"step {report.step} ({report.seconds / 60:.1f} min): valid loss {loss:.4f}, "
                   f"greedy BLEU {scores.bleu:.2f}, chrF {scores.chrf:.2f}")

    losses, seconds = run_with_checkpoints(
        run, trainer, functools.partial(train_translation, trainer, settings),
        progress=progress, minutes=settings.minutes, every_step=validate, vocabulary=vocabulary.to_tensor())

    # 4. the report: the test split, greedy and beam 4
    if not world.is_main:
        return []
    scores = score_test_split(trainer.model, vocabulary, corpus.test, normalization, progress)
    references = sum(len(example.references) for example in corpus.test)
    return [loss_line(losses, seconds, trainer.step),
            f"test split: {len(corpus.test):,} English sentences of at most {corpus_settings.max_words} "
            f"words, {references:,} French references (data: {ATTRIBUTION})",
            *score_lines(scores)]
