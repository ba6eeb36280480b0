"""One seed, five learners: every variant trained on real translation from the same seed, on the
same batches, for the same number of steps; then each row's validation loss, test BLEU (greedy
and beam 4), training speed, and the share of test sentences it translates exactly as explicit.

    settings = LearnersSettings(CorpusSettings("fra-eng.zip"), TRAINING_PRESETS["cpu"].replace(steps=1000))
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

The study (``run_study``, ``study_table``) repeats this from several seeds, with rounding-only
controls of each row beside it, and sets the rows' spread against a row's spread with itself.

Rows run one after another, each to its end (training, then scoring): torch's global generator
holds the dropout stream, so a row that runs alone needs no swapping of generator states, and
its result can be saved (``on_row``) before the next starts. Prints nothing: ``python -m
benchmarks.studies.learners`` is the command line over this.

Shape legend:
    B  sentences (batch)   T  target length (BOS and EOS included)
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import scipy.stats
import torch
from tabulate import tabulate
from torch import Tensor, nn

from common.checks import check_int, check_seed
from common.config import TransformerConfig
from seq2seq.data.batches import EncodedPairs, TokenBatches, TranslationData, encode_pairs, within
from seq2seq.data.corpus import ATTRIBUTION, Corpus, CorpusSettings, Example, load_corpus
from seq2seq.data.ids import PAD_ID
from seq2seq.data.subwords import Vocabulary, train_vocabulary
from seq2seq.evaluation import corpus_scores
from seq2seq.pipeline import (
    TranslationSettings,
    train_translation,
    training_sentences,
    translate_sentences,
    validation_loss,
)
from seq2seq.training.recipe import StepReport
from seq2seq.training.trainer import Trainer, seed_dropout
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
        check_seed("LearnersSettings.seed", self.seed)
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
    for name, kept in (("training", train), ("validation", valid)):
        if not kept.sources:  # said here, not as TokenBatches' "got 0 and 0"
            raise ValueError(f"every {name} pair is longer than max_seq_len {translation.max_seq_len} "
                             "pieces (source or target, with BOS and EOS), the length filter left none: "
                             "a smaller --max-words, or a larger max_seq_len")
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
                  on_step: Callable[[StepReport], None] | None = None,
                  clock: Callable[[], float] = time.perf_counter) -> tuple[nn.Module, Learning]:
    """Train row ``variant`` from the seed: up to ``steps`` steps (None: the settings' steps or
    minutes, whichever ends first, the minutes read on ``clock``); returns the trained model, in
    train mode, and its record.

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
        losses = train_translation(trainer, run, on_step=record, clock=clock)
    return model, Learning(variant, tuple(losses), tuple(seconds), batches.target_tokens)


def score_learner(model: nn.Module, learning: Learning, data: LearnerData, settings: LearnersSettings,
                  baseline: Learner | None = None) -> Learner:
    """``learning`` with its model's validation loss and test scores, greedy and beam 4, and the
    share of test sentences translated exactly as ``baseline`` (None: this row is the baseline)."""
    translations = {size: tuple(translate_sentences(model, data.vocabulary, [e.source for e in data.test],
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


# --- the study: seeds, rounding-only controls, resume ---------------------------------------
#
# One run is (row, seed, control). Control 0 is the row as it is; control k >= 1 is the same
# row, the same seed, the same batches, dropout masks and weights, with the learning-rate factor
# moved by k units in the last place of float32 (``perturbed_factor``). The optimiser's kernels
# take each step's rate as a float32 scalar on float32 weights, so a float64 ulp would mostly
# round away; k float32 ulps moves every step's update by about k roundings and nothing else:
# the first loss (before any step) is the same to the bit, and what follows parts only as the
# training magnifies those last bits. A row's spread over its controls is therefore the spread
# that rounding alone makes; the rows' spread is set against it (``study_statistics``). That holds
# for few ulps only: k ulps move the factor by up to k * 2^-23 of itself (at the bottom of its
# binade), so k is capped at MAX_CONTROLS, where the rate moves by less than MAX_RATE_CHANGE
# (100,000 ulps would move it by up to 1.2%: another learning rate, not another rounding).

FLOAT32_MANTISSA = 23  # fraction bits of float32 (float64 has 52)
MAX_RATE_CHANGE = 1e-4  # the most a control may move the learning rate, relative: 0.01%
MAX_CONTROLS = math.floor(MAX_RATE_CHANGE * 2**FLOAT32_MANTISSA)  # 838: 838 * 2^-23 = 0.00999%
STUDY_METRICS = ("bleu_beam", "bleu_greedy", "valid_loss")  # the scalar metrics, in the table's order
METRIC_NAMES = {"bleu_beam": f"BLEU beam {BEAM_SIZE}", "bleu_greedy": "BLEU greedy",
                "valid_loss": "valid loss"}


def check_controls(name: str, controls: object) -> int:
    """``controls`` if it is an int in 0..MAX_CONTROLS: a ValueError naming ``name`` otherwise."""
    check_int(name, controls, low=0)
    if controls > MAX_CONTROLS:
        raise ValueError(f"{name} must be at most {MAX_CONTROLS} (rounding only: {MAX_CONTROLS} float32 ulps "
                         f"move the learning rate by less than {MAX_RATE_CHANGE:.2%}), got {controls}")
    return controls


def perturbed_factor(factor: float, control: int) -> float:
    """``factor`` moved up by ``control`` float32 ulps (of its own binade): exact in float64,
    ``factor`` itself for control 0; ``control`` at most MAX_CONTROLS."""
    check_controls("control", control)
    if not math.isfinite(factor) or factor <= 0:
        raise ValueError(f"lr_factor must be a positive finite number, got {factor!r}")
    return factor + control * math.ulp(factor) * 2.0 ** (52 - FLOAT32_MANTISSA)


def study_runs(variants: tuple[str, ...], seeds: tuple[int, ...],
               controls: int) -> list[tuple[str, int, int]]:
    """Every run's (row, seed, control), in the order they run: seed by seed, row by row, each
    row's controls after it, so a study stopped early holds whole seeds first."""
    return [(variant, seed, control)
            for seed in seeds for variant in variants for control in range(controls + 1)]


def run_key(record: dict) -> tuple[str, int, int]:
    """A run record's (row, seed, control)."""
    return record["variant"], record["seed"], record["control"]


def run_study(settings: LearnersSettings, data: LearnerData, seeds: tuple[int, ...], controls: int,
              done: tuple[dict, ...] = (), on_run: Callable[[list[dict]], None] | None = None,
              on_step: Callable[[tuple[str, int, int], StepReport], None] | None = None) -> list[dict]:
    """Train and score every (row, seed, control) not in ``done``, each for
    ``settings.translation.steps`` steps (the budget is steps: every run does the same work);
    returns ``done``'s records and the new ones, ``on_run`` sees them after every run (save them
    there: a study stopped later resumes from them). Each seed sets the weights, the batch stream
    and the dropout, as ``--seed`` does for one row."""
    if settings.translation.minutes is not None:
        raise ValueError("the study's budget is steps (every run does the same work): minutes must be None")
    if not isinstance(seeds, tuple) or not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be a non-empty tuple without repeats, got {seeds!r}")
    for seed in seeds:
        check_seed("seed", seed)
    check_controls("controls", controls)
    records = list(done)
    recorded = {run_key(record) for record in records}
    steps = settings.translation.steps
    for key in study_runs(settings.variants, seeds, controls):
        if key in recorded:
            continue
        variant, seed, control = key
        factor = perturbed_factor(settings.translation.lr_factor, control)
        run_settings = dataclasses.replace(settings, seed=seed,
                                           translation=settings.translation.replace(lr_factor=factor))
        run_data = dataclasses.replace(data, stream=dataclasses.replace(data.stream, seed=seed))
        shown = None if on_step is None else lambda report, at=key: on_step(at, report)
        model, learning = train_learner(variant, run_data, run_settings, steps, shown)
        row = score_learner(model, learning, run_data, run_settings)
        records.append({"variant": variant, "seed": seed, "control": control, "lr_factor": factor,
                        "steps": steps, "losses": list(row.losses), "seconds": list(row.seconds),
                        "valid_loss": row.valid_loss,
                        "bleu": {str(size): value for size, value in row.bleu.items()},
                        "translations": {str(size): list(texts) for size, texts in row.translations.items()}})
        recorded.add(key)
        if on_run is not None:
            on_run(records)
    return records


def metric_value(record: dict, metric: str) -> float:
    """One scalar metric of a run record (one of STUDY_METRICS)."""
    if metric == "valid_loss":
        return float(record["valid_loss"])
    if metric in ("bleu_beam", "bleu_greedy"):
        return float(record["bleu"][str(BEAM_SIZE if metric == "bleu_beam" else 1)])
    raise ValueError(f"metric must be one of {', '.join(STUDY_METRICS)}, got {metric!r}")


def _pooled_spread(groups: list[list[float]]) -> float:
    """The pooled standard deviation: the root of the mean sample variance (ddof 1) of the
    groups with at least two values; NaN when none has two."""
    variances = [statistics.variance(group) for group in groups if len(group) >= 2]
    return math.sqrt(sum(variances) / len(variances)) if variances else float("nan")


def _grouped(records: list[dict], by: Callable[[dict], tuple]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        groups.setdefault(by(record), []).append(record)
    return groups


def _row_and_seed(record: dict) -> tuple:
    return record["variant"], record["seed"]


def _seed_and_control(record: dict) -> tuple:
    return record["seed"], record["control"]


@dataclass(frozen=True)
class MetricStatistic:
    """One metric's spreads and the test of whether the rows differ."""

    metric: str
    between: float  # pooled SD across rows, at each (seed, control): what changing the row does
    within: float  # pooled SD across one row's controls, at each seed: what rounding alone does
    h: float  # Kruskal–Wallis H over the rows (every run of a row is one group)
    p_value: float
    epsilon_squared: float  # the effect size H / (n - 1), from 0 (no row effect) to 1
    friedman_q: float  # Friedman's Q: the rows ranked within each (seed, control); NaN below 3 rows
    friedman_p: float
    kendall_w: float  # its effect size Q / (blocks (k - 1)): 0 no shared order, 1 one order in every block


def metric_statistic(records: list[dict], metric: str) -> MetricStatistic:
    """The between-row and within-row spread of ``metric`` and a Kruskal–Wallis test over rows.

    Between: at each (seed, control) the rows' values, their sample SD, pooled over (seed,
    control) as the root of the mean variance. Within: at each (row, seed) the values of its
    controls (the rounding-only perturbations), likewise pooled. If the row did not matter, the
    between spread would be about the within spread.

    The test (``scipy.stats.kruskal``, the chi-squared approximation with k - 1 degrees of
    freedom, ties corrected) groups every run of a row together. It assumes the runs are
    independent draws and that the rows' distributions differ, if at all, by a shift. The runs of
    one seed share weights, batches and dropout, so they are not independent: with several seeds
    and few controls the test reads the seed-to-seed spread as part of each row's; read its
    p-value as a screen, the spreads as the measurement. The effect size is epsilon squared,
    H / (n - 1) for n runs.

    It needs at least two rows and at least two runs of each (two seeds, or a control): with one
    run per row, H is k - 1 whatever the values and a row's spread with itself is unknown, so
    that is a ValueError, not a p-value (``python -m benchmarks.studies.learners`` refuses such a study
    before it trains).
    """
    rows: dict[str, list[float]] = {}
    for record in records:
        rows.setdefault(record["variant"], []).append(metric_value(record, metric))
    if len(rows) < 2:
        raise ValueError(f"the test needs at least two rows, got {', '.join(rows) or 'none'}")
    single = [row for row, values in rows.items() if len(values) < 2]
    if single:
        raise ValueError(f"the test needs at least two runs of each row (two seeds, or --controls 1), "
                         f"got 1 of {', '.join(single)}")
    between = _pooled_spread([[metric_value(r, metric) for r in group]
                              for group in _grouped(records, _seed_and_control).values()])
    within = _pooled_spread([[metric_value(r, metric) for r in group]
                             for group in _grouped(records, _row_and_seed).values()])
    values = [value for group in rows.values() for value in group]
    if len(set(values)) == 1:  # every run alike: no ranks to compare, nothing differs
        h, p_value = 0.0, 1.0
    else:
        test = scipy.stats.kruskal(*rows.values())
        h, p_value = float(test.statistic), float(test.pvalue)
    q, q_p, w = friedman(records, metric, sorted(rows))
    return MetricStatistic(metric, between, within, h, p_value, h / (len(values) - 1), q, q_p, w)


def friedman(records: list[dict], metric: str, rows: list[str]) -> tuple[float, float, float]:
    """Friedman's test of the rows with each (seed, control) a block, every row run once in it:
    (Q, p, Kendall's W). It asks whether the rows keep an order within blocks, so the spread
    from seed to seed, which the blocks share, does not count against the rows (the design the
    study runs; Kruskal–Wallis pools it in). Blocks missing a row are left out; with fewer than
    three rows, or fewer than two blocks, NaN."""
    blocks = [{r["variant"]: metric_value(r, metric) for r in group}
              for group in _grouped(records, _seed_and_control).values()]
    blocks = [block for block in blocks if all(row in block for row in rows)]
    if len(rows) < 3 or len(blocks) < 2:
        return math.nan, math.nan, math.nan
    if all(len(set(block.values())) == 1 for block in blocks):  # every block a tie: no order
        return 0.0, 1.0, 0.0
    test = scipy.stats.friedmanchisquare(*([block[row] for block in blocks] for row in rows))
    q = float(test.statistic)
    return q, float(test.pvalue), q / (len(blocks) * (len(rows) - 1))


def identical_shares(records: list[dict], beam: int) -> tuple[float, float]:
    """(between, within): the mean share of test sentences translated identically by two rows
    at the same (seed, control), every pair of rows; and by a row's control k >= 1 and its
    control 0 at the same seed. NaN where there is no such pair."""
    key = str(beam)
    between = [identical_share(tuple(a["translations"][key]), tuple(b["translations"][key]))
               for group in _grouped(records, _seed_and_control).values()
               for i, a in enumerate(group) for b in group[i + 1:]]
    within = []
    for group in _grouped(records, _row_and_seed).values():
        plain = [r for r in group if r["control"] == 0]
        within += [identical_share(tuple(r["translations"][key]), tuple(plain[0]["translations"][key]))
                   for r in group if plain and r["control"] != 0]
    mean = statistics.fmean
    return (mean(between) if between else float("nan"), mean(within) if within else float("nan"))


STUDY_HEADERS = ("measure", "between rows", "within a row (rounding)", "between / within",
                 "Kruskal-Wallis H", "p", "epsilon^2", "Friedman Q", "p (Friedman)", "Kendall's W")


def study_table(records: list[dict]) -> str:
    """The statistic as a Markdown table: a line for each metric's spreads and test, and a line
    for each beam's identical-translation share (rows against each other, a row against its
    own controls)."""
    cells = []
    for metric in STUDY_METRICS:
        s = metric_statistic(records, metric)
        ratio = s.between / s.within if s.within > 0 else float("nan")
        cells.append([f"{METRIC_NAMES[metric]} (SD)", f"{s.between:.4f}", f"{s.within:.4f}", f"{ratio:.2f}",
                      f"{s.h:.3f}", f"{s.p_value:.3g}", f"{s.epsilon_squared:.3f}",
                      f"{s.friedman_q:.3f}", f"{s.friedman_p:.3g}", f"{s.kendall_w:.3f}"])
    for beam, name in ((BEAM_SIZE, f"beam {BEAM_SIZE}"), (1, "greedy")):
        between, within = identical_shares(records, beam)
        cells.append([f"identical translations ({name})", f"{between:.1%}", f"{within:.1%}",
                      *["-"] * 7])
    runs = len(records)
    rows = len({r["variant"] for r in records})
    seeds = len({r["seed"] for r in records})
    what = f"{runs} runs: {rows} rows, {seeds} seeds, {max(r['control'] for r in records)} controls each"
    return f"{what}\n\n{tabulate(cells, STUDY_HEADERS, tablefmt='github', disable_numparse=True)}\n"
