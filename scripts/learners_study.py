"""One seed, five learners: every variant trained on real translation from the same seed, on the
same batches, for the same number of steps; then each row's validation loss, test BLEU (greedy
and beam 4), training speed, and the share of test sentences it translates exactly as explicit.

    settings = LearnersSettings(CorpusSettings("fra-eng.zip"), PRESETS["cpu"].replace(steps=1000))
    data = prepare(settings)                          # corpus, vocabulary, encoded splits, config
    result = run_learners(settings, data, on_row=lambda r: save(as_json(r)))
    print(markdown_report(result))

Every row starts from the canonical weights of ``seed`` (``variants.build``), draws its batches
from its own ``TokenBatches`` seeded alike (so every row trains on the same batches) and its
dropout from torch's global generator seeded by ``seq2seq.training.trainer.seed_dropout``. The
from-scratch rows draw the same masks from it; the torch row draws the same numbers, but three of
its dropouts per layer act on a tensor stored in (L, B, D) order, and CPU dropout fills a mask
in memory order, so its masks land on other elements (docs/translation.md, "One seed, five
learners"). Under those masks its run is another sample of the same training.

Rows run one after another, each to its end (training, then scoring): torch's global generator
holds the dropout stream, so a row that runs alone needs no swapping of generator states, and
its result can be saved (``on_row``) before the next starts. Prints nothing: ``python -m
scripts.learners`` is the command line over this.

Shape legend:
    B  sentences (batch)   T  target length (BOS and EOS included)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from tabulate import tabulate
from torch import Tensor, nn

from common.checks import check_int
from common.config import TransformerConfig
from seq2seq.data.batches import EncodedPairs, TokenBatches, TranslationData, encode_pairs, within
from seq2seq.data.corpus import ATTRIBUTION, Corpus, CorpusSettings, Example, load_corpus
from seq2seq.data.ids import PAD_ID
from seq2seq.data.subwords import Vocabulary, train_vocabulary
from seq2seq.evaluation import corpus_scores
from seq2seq.training.recipe import StepReport
from seq2seq.training.trainer import Trainer, seed_dropout
from seq2seq.translation import (
    TranslationSettings,
    train_translation,
    training_sentences,
    translate,
    validation_loss,
)
from variants import REFERENCE, VARIANTS, build

BASELINE = "explicit"  # the row whose translations the others are compared with; it runs first
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64}
BEAM_SIZE = 4  # the beam of the table's second BLEU column (greedy is the first)


@dataclass(frozen=True)
class LearnersSettings:
    """What every row shares: the corpus, the model and its training, the seed and the rows."""

    corpus: CorpusSettings  # the export, its length filter and split
    translation: TranslationSettings  # model, vocabulary, batches and recipe; .steps and .minutes
    # bound the first row, whose step count becomes every other row's budget
    variants: tuple[str, ...] = VARIANTS  # the rows, in the order they run; explicit first
    seed: int = 0  # weights, batch stream and dropout of every row
    dtype: str = "float32"  # "float32" or "float64": the weights and the arithmetic
    device: str = "cpu"  # where every row trains and translates
    test_sentences: int | None = None  # score only the first N test sentences (None: all)

    def __post_init__(self) -> None:
        if not isinstance(self.variants, tuple) or not self.variants:
            raise ValueError(f"LearnersSettings.variants must be a non-empty tuple, got {self.variants!r}")
        unknown = [name for name in self.variants if name not in VARIANTS]
        if unknown:
            raise ValueError(f"LearnersSettings.variants: unknown {', '.join(map(repr, unknown))}; "
                             f"the rows are {', '.join(VARIANTS)}")
        if len(set(self.variants)) != len(self.variants):
            raise ValueError(f"LearnersSettings.variants names a row twice: {', '.join(self.variants)}")
        if self.variants[0] != BASELINE:
            raise ValueError(f"LearnersSettings.variants must start with {BASELINE} (the row the others' "
                             f"translations are compared with), got {', '.join(self.variants)}")
        check_int("LearnersSettings.seed", self.seed)
        if self.dtype not in DTYPES:
            raise ValueError(f"LearnersSettings.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.test_sentences is not None:
            check_int("LearnersSettings.test_sentences", self.test_sentences, low=1)


@dataclass(frozen=True)
class LearnerData:
    """What ``prepare`` reads and trains once for every row."""

    corpus: Corpus  # the three splits
    vocabulary: Vocabulary  # trained on the train split
    train: EncodedPairs  # every (source, translation) pair of the train split, as ids
    valid: EncodedPairs  # the validation split's pairs, for the validation loss
    test: tuple[Example, ...]  # the sentences scored (the first test_sentences of the test split)
    config: TransformerConfig  # every row's model
    stream: TranslationData  # every row's batch stream (one seed: the same batches)


def prepare(settings: LearnersSettings) -> LearnerData:
    """Load the corpus, train its vocabulary, encode the splits: one vocabulary for every row.
    Pairs longer than the model's ``max_seq_len`` are left out of training and validation, as
    ``python -m seq2seq.train --task translate`` leaves them; a ``batch_tokens`` that cannot hold
    the longest pair left is a ``ValueError`` here, before any row trains."""
    translation = settings.translation
    corpus = load_corpus(settings.corpus)
    vocabulary = train_vocabulary(training_sentences(corpus), translation.vocabulary_settings())
    stream = TranslationData(settings.corpus, translation.vocabulary_settings(), translation.batch_tokens,
                             translation.pool_size, settings.seed)
    train, _ = within(encode_pairs(vocabulary, corpus.pairs("train")), translation.max_seq_len)
    valid, _ = within(encode_pairs(vocabulary, corpus.pairs("valid")), translation.max_seq_len)
    TokenBatches(train, stream)  # checks that batch_tokens holds every pair
    test = corpus.test[:settings.test_sentences]
    longest = max(len(ids) + 1 for ids in vocabulary.encode([e.source for e in test]))
    if longest > translation.max_seq_len:
        raise ValueError(f"a test sentence is {longest} pieces long with EOS, more than max_seq_len "
                         f"{translation.max_seq_len}: a smaller --max-words")
    return LearnerData(corpus, vocabulary, train, valid, test, translation.config(), stream)


@dataclass(frozen=True)
class Learning:
    """One row's training: what it saw and how long it took."""

    variant: str
    losses: tuple[float, ...]  # each step's training loss (label-smoothed, as the trainer reports it)
    seconds: tuple[float, ...]  # training time at the end of each step, since the first began
    target_tokens: int  # target tokens predicted over all steps: EOS included, BOS and padding not

    @property
    def tokens_per_second(self) -> float:
        """Target tokens trained on per second of training."""
        return self.target_tokens / self.seconds[-1]


@dataclass(frozen=True)
class Learner(Learning):
    """One row's training and what the trained model does on held-out text."""

    valid_loss: float = float("nan")  # teacher-forced cross-entropy per target token, validation split
    bleu: dict[int, float] = dataclasses.field(default_factory=dict)  # beam size (1: greedy) -> test BLEU
    chrf: dict[int, float] = dataclasses.field(default_factory=dict)  # beam size -> test chrF
    translations: dict[int, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # beam size ->
    # the test sentences' translations, in order
    identical: dict[int, float] = dataclasses.field(default_factory=dict)  # beam size -> share of test
    # sentences translated exactly as the baseline row translates them
    bleu_signature: str = ""  # how sacreBLEU computed the BLEU


@dataclass(frozen=True)
class LearnersResult:
    """The rows done so far, and what they share."""

    settings: LearnersSettings
    steps: int  # every row's budget (the first row's steps)
    test_sentences: int  # sentences scored
    references: int  # their French references, all of them
    rows: tuple[Learner, ...]


class _CountedBatches:
    """A batch stream that counts, per batch, the target tokens it asks the model to predict."""

    def __init__(self, batches: Iterator[tuple[Tensor, Tensor]]) -> None:
        self.batches = batches
        self.target_tokens = 0

    def __iter__(self) -> _CountedBatches:
        return self

    def __next__(self) -> tuple[Tensor, Tensor]:
        src, tgt = next(self.batches)  # (B, S), (B, T)
        self.target_tokens += int((tgt[:, 1:] != PAD_ID).sum())  # the labels: tgt without BOS
        return src, tgt


def train_learner(variant: str, data: LearnerData, settings: LearnersSettings, steps: int | None = None,
                  on_step: Callable[[StepReport], None] | None = None) -> tuple[nn.Module, Learning]:
    """Train row ``variant`` from the seed: up to ``steps`` steps (None: the settings' steps or
    minutes, whichever ends first); returns the trained model, in train mode, and its record.

    Seeds torch's global generator for dropout (``seed_dropout``) inside ``torch.random.fork_rng``,
    so the caller's generator state is as it was.
    """
    if variant not in settings.variants:
        raise ValueError(f"{variant!r} is not one of the settings' rows ({', '.join(settings.variants)})")
    run = settings.translation if steps is None else settings.translation.replace(steps=steps, minutes=None)
    device = torch.device(settings.device)
    seconds: list[float] = []

    def record(report: StepReport) -> None:
        seconds.append(report.seconds)
        if on_step is not None:
            on_step(report)

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = build(variant, data.config, seed=settings.seed).to(device, DTYPES[settings.dtype])
        batches = _CountedBatches(TokenBatches(data.train, data.stream))
        trainer = Trainer(model, batches, run.recipe())
        seed_dropout(settings.seed)
        losses = train_translation(trainer, run, on_step=record)
    return model, Learning(variant, tuple(losses), tuple(seconds), batches.target_tokens)


def score_learner(model: nn.Module, learning: Learning, data: LearnerData, settings: LearnersSettings,
                  baseline: Learner | None = None) -> Learner:
    """``learning`` with its model's validation loss and test scores, greedy and beam 4, and the
    share of test sentences translated exactly as ``baseline`` (None: this row is the baseline)."""
    translations = {size: tuple(translate(model, data.vocabulary, [e.source for e in data.test],
                                          beam_size=size, normalization=settings.corpus.normalization))
                    for size in (1, BEAM_SIZE)}
    references = [example.references for example in data.test]
    scores = {size: corpus_scores(list(texts), references) for size, texts in translations.items()}
    reference = translations if baseline is None else baseline.translations
    identical = {size: identical_share(texts, reference[size]) for size, texts in translations.items()}
    return Learner(**dataclasses.asdict(learning),
                   valid_loss=validation_loss(model, data.valid, settings.translation.batch_tokens),
                   bleu={size: s.bleu for size, s in scores.items()},
                   chrf={size: s.chrf for size, s in scores.items()},
                   translations=translations, identical=identical,
                   bleu_signature=scores[1].bleu_signature)


def identical_share(translations: tuple[str, ...], baseline: tuple[str, ...]) -> float:
    """Share of sentences whose translation equals the baseline's, character for character."""
    if len(translations) != len(baseline) or not translations:
        raise ValueError(f"need as many translations as the baseline's, at least one: got "
                         f"{len(translations)} and {len(baseline)}")
    return sum(a == b for a, b in zip(translations, baseline, strict=True)) / len(translations)


def run_learners(settings: LearnersSettings, data: LearnerData | None = None,
                 on_row: Callable[[LearnersResult], None] | None = None,
                 on_step: Callable[[str, StepReport], None] | None = None) -> LearnersResult:
    """Train and score every row, one after another; ``on_row`` sees the result after each row
    (save it there: a run stopped later keeps the rows done), ``on_step`` each row's steps."""
    data = data if data is not None else prepare(settings)
    rows: list[Learner] = []
    steps: int | None = None  # set by the first row
    references = sum(len(example.references) for example in data.test)
    result = None
    for variant in settings.variants:
        shown = None if on_step is None else lambda report, name=variant: on_step(name, report)
        model, learning = train_learner(variant, data, settings, steps, shown)
        steps = len(learning.losses) if steps is None else steps
        rows.append(score_learner(model, learning, data, settings, rows[0] if rows else None))
        result = LearnersResult(settings, steps, len(data.test), references, tuple(rows))
        if on_row is not None:
            on_row(result)
    return result


# --- the report ---------------------------------------------------------------------------

HEADERS = ("variant", "steps", "train loss (last 10)", "valid loss", f"BLEU beam {BEAM_SIZE}",
           "BLEU greedy", "target tokens/s", f"/ {REFERENCE}'s", f"as {BASELINE} (beam {BEAM_SIZE})",
           f"as {BASELINE} (greedy)")


def table_rows(result: LearnersResult) -> list[list[str]]:
    """The table's cells, one row per learner, in HEADERS' order."""
    speeds = {row.variant: row.tokens_per_second for row in result.rows}
    cells = []
    for row in result.rows:
        last = row.losses[-10:]
        relative = (f"{speeds[row.variant] / speeds[REFERENCE]:.2f}x" if REFERENCE in speeds else "-")
        cells.append([row.variant, str(len(row.losses)), f"{sum(last) / len(last):.4f}",
                      f"{row.valid_loss:.4f}", f"{row.bleu[BEAM_SIZE]:.2f}", f"{row.bleu[1]:.2f}",
                      f"{row.tokens_per_second:,.0f}", relative,
                      f"{row.identical[BEAM_SIZE]:.1%}", f"{row.identical[1]:.1%}"])
    return cells


def markdown_report(result: LearnersResult) -> str:
    """The table in Markdown, after a line saying what was trained and scored on what."""
    settings = result.settings
    translation = settings.translation
    what = (f"{result.steps} steps of {translation.batch_tokens} tokens, seed {settings.seed}, "
            f"{settings.dtype} on {settings.device}; d_model {translation.d_model}, "
            f"{translation.n_heads} heads, {translation.n_layers} + {translation.n_layers} layers, "
            f"dropout {translation.dropout:g}, {translation.vocabulary_size} subwords; test: "
            f"{result.test_sentences:,} English sentences of at most {settings.corpus.max_words} words, "
            f"{result.references:,} French references (data: {ATTRIBUTION})")
    table = tabulate(table_rows(result), HEADERS, tablefmt="github", disable_numparse=True)
    return f"{what}\n\n{table}\n\nBLEU signature: `{result.rows[0].bleu_signature}`\n"


def as_json(result: LearnersResult) -> dict:
    """The result as plain JSON data: settings, shared facts, and every row in full."""
    return {
        "settings": dataclasses.asdict(result.settings),
        "steps": result.steps,
        "test_sentences": result.test_sentences,
        "references": result.references,
        "attribution": ATTRIBUTION,
        "torch": torch.__version__,
        "rows": [{**dataclasses.asdict(row), "tokens_per_second": row.tokens_per_second}
                 for row in result.rows],
    }
