"""One seed, five learners: train every variant on a translation corpus from the same seed, on
the same batches, for the same steps; overlay their loss curves and tabulate what each learned.

    python -m benchmarks.studies.learners --data fra-eng.zip --steps 1000 --out runs/learners
    python -m benchmarks.studies.learners --data fra-eng.zip --minutes 10 --out runs/learners --threads 2
    python -m benchmarks.studies.learners --data fra-eng.zip --steps 300 --seeds 0 1 2 --controls 1 \
        --out runs/study

With ``--seeds`` or ``--controls`` it runs the study instead: every row from each seed, and
``--controls N`` more runs of each (row, seed) whose learning-rate factor is moved by k float32
ulps for the k-th (``benchmarks.studies.learners.study.perturbed_factor``: a change of rounding only, so N is
at most 838, where the rate moves by less than 0.01%), all for ``--steps`` steps; a study needs
two runs of each row (two seeds, or a control) for its statistic. It writes ``study.json`` (every
run's record) after each run; run again with the same ``--out`` and it skips the runs already
recorded. At the end it draws ``study.png`` (every run's loss curve, coloured by row, dashed for
a control) and prints the between-row against within-row spreads and the test of whether the
rows differ.

writes, in ``--out``, ``learners.json`` (every row in full: its loss and time per step, its
translations of the test sentences) and ``learners.md`` (the table: validation loss, test BLEU
beam 4 and greedy, target tokens/s beside torch's, the share of test sentences translated
exactly as explicit) after each row, so a run stopped later keeps the rows done, and at the end
``learners.png`` (the loss curves, by step and by training time). ``--minutes`` bounds the first
row (explicit); the steps it reaches are every other row's budget. The model, vocabulary,
batches and recipe are the ``--preset``'s (seq2seq.train's translate presets), any of them
overridden by its option. A thin shell over ``benchmarks.studies.learners.study``; the picture
needs matplotlib (``pip install -e ".[plot]"``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from benchmarks.studies.learners.study import (
    DTYPES,
    MAX_CONTROLS,
    LearnersResult,
    LearnersSettings,
    as_json,
    check_controls,
    markdown_report,
    prepare,
    run_key,
    run_learners,
    run_study,
    study_table,
)
from common.cli import (
    Parser,
    config_or_exit,
    device_or_exit,
    non_negative_int,
    one_line,
    positive,
    seed_int,
    write_probe,
)
from seq2seq.data.corpus import CorpusSettings
from seq2seq.pipeline import TRAINING_PRESETS
from variants import VARIANTS

PROG = "python -m benchmarks.studies.learners"
JSON_FILE, TABLE_FILE, PICTURE_FILE = "learners.json", "learners.md", "learners.png"
STUDY_FILE, STUDY_PICTURE = "study.json", "study.png"
# TranslationSettings field -> (option, its type): each defaults to the preset's value
OVERRIDES = {"d_model": ("--d-model", int), "n_heads": ("--heads", int), "n_layers": ("--layers", int),
             "d_ff": ("--d-ff", int), "dropout": ("--dropout", float), "vocabulary_size": ("--vocab", int),
             "batch_tokens": ("--batch-tokens", int), "warmup": ("--warmup", int),
             "lr_factor": ("--lr-factor", float)}
SMOOTHING = 20  # steps in the running mean the picture draws


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, LearnersSettings]:
    """The options and the run's settings; a bad value is a one-line usage error (exit status 2)."""
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, metavar="PATH",
                        help="a manythings.org export: fra-eng.zip or its fra.txt")
    parser.add_argument("--out", type=Path, required=True, help="folder for the results (created if needed)")
    parser.add_argument("--steps", type=positive(int), default=None,
                        help="steps of every row (default: the preset's, or as many as --minutes allow)")
    parser.add_argument("--minutes", type=positive(float), default=None,
                        help="training time of the first row; its steps become every row's budget")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), metavar="NAME",
                        help=f"the rows, explicit first (default: {' '.join(VARIANTS)})")
    parser.add_argument("--preset", choices=tuple(TRAINING_PRESETS), default="cpu")
    for field, (option, kind) in OVERRIDES.items():
        parser.add_argument(option, type=kind, default=None, dest=field,
                            help=f"TranslationSettings.{field} (default: the preset's)")
    parser.add_argument("--max-words", type=positive(int), default=8, metavar="N",
                        help="keep English sentences of at most N words (default 8)")
    parser.add_argument("--test-sentences", type=positive(int), default=None, metavar="N",
                        help="score the first N test sentences only (default: all)")
    parser.add_argument("--seed", type=seed_int, default=0, help="weights, batches and dropout of every row")
    parser.add_argument("--seeds", type=seed_int, nargs="+", default=None, metavar="SEED",
                        help="the study: every row from each of these seeds (needs --steps)")
    parser.add_argument("--controls", type=non_negative_int, default=0, metavar="N",
                        help="the study: N more runs of each (row, seed), the k-th with the learning-rate "
                             f"factor moved by k float32 ulps, at most {MAX_CONTROLS} (default 0)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=positive(int), default=None)
    args = parser.parse_args(argv)
    if not args.data.is_file():
        parser.error(f"--data {args.data}: no such file")
    device_or_exit(parser, args.device)
    args.study = args.seeds is not None or args.controls > 0
    if args.study:
        if args.steps is None or args.minutes is not None:
            parser.error("the study (--seeds, --controls) takes its budget in --steps, not --minutes")
        args.seeds = tuple(args.seeds) if args.seeds is not None else (args.seed,)
        if len(set(args.seeds)) != len(args.seeds):
            parser.error(f"--seeds names a seed twice: {' '.join(map(str, args.seeds))}")
        if len(set(args.variants)) < 2:  # the statistic compares rows with each other
            parser.error("the study compares rows: give --variants at least two, "
                         f"got {' '.join(args.variants)}")
        try:  # more ulps than that would change the learning rate, not its rounding
            check_controls("--controls", args.controls)
        except ValueError as error:
            parser.error(str(error))
        if len(args.seeds) * (args.controls + 1) < 2:  # the statistic needs a row's spread with itself
            parser.error("the study needs at least two runs of each row for its statistic (a row's spread "
                         "with itself, Kruskal-Wallis' groups): give --seeds two or more, or --controls 1; "
                         f"got --seeds {args.seeds[0]} alone")
    overrides = {field: getattr(args, field) for field in OVERRIDES if getattr(args, field) is not None}
    if args.steps is not None or args.minutes is not None:
        overrides |= {"minutes": args.minutes,
                      "steps": args.steps if args.steps is not None else TRAINING_PRESETS[args.preset].steps}
    try:
        settings = LearnersSettings(
            CorpusSettings(str(args.data), max_words=args.max_words),
            TRAINING_PRESETS[args.preset].replace(**overrides), variants=tuple(args.variants), seed=args.seed,
            dtype=args.dtype, device=args.device, test_sentences=args.test_sentences)
    except (TypeError, ValueError) as error:
        parser.error(one_line(error))
    translation = settings.translation  # the model every row builds, checked before the corpus is read
    config_or_exit(parser, d_model=translation.d_model, n_heads=translation.n_heads,
                   n_layers=translation.n_layers, d_ff=translation.d_ff, dropout=translation.dropout,
                   src_vocab_size=translation.vocabulary_size, tgt_vocab_size=translation.vocabulary_size)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"--out {args.out}: {error.strerror or error}")
    if problem := write_probe(args.out):
        parser.error(f"--out {args.out}: not writable ({problem.strerror or problem})")
    # written after each run and at the end: a folder in a file's place would fail after training
    for name in (STUDY_FILE, STUDY_PICTURE) if args.study else (JSON_FILE, TABLE_FILE, PICTURE_FILE):
        if (args.out / name).exists() and not (args.out / name).is_file():
            parser.error(f"--out {args.out}: {name} is a directory, not a file (results are written there)")
    return args, settings


def study_fingerprint(settings: LearnersSettings) -> dict:
    """What every run of a study must share to be pooled: all the settings but the seed."""
    shared = dataclasses.asdict(settings)
    del shared["seed"]
    return json.loads(json.dumps(shared))  # as it reads back from JSON (tuples as lists)


def recorded_runs(path: Path, settings: LearnersSettings) -> tuple[dict, ...]:
    """The runs an earlier study in ``path`` recorded (none if there is no file); a file of
    other settings is a ValueError naming the first setting that differs."""
    if not path.is_file():
        return ()
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        runs, shared = saved["runs"], saved["settings"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a study file ({one_line(error)})") from None
    expected = study_fingerprint(settings)
    for field in sorted(set(expected) | set(shared)):
        if expected.get(field) != shared.get(field):
            raise ValueError(f"{path}: recorded with other settings ({field}); use another --out")
    return tuple(runs)


def draw_study_curves(plt, records: list[dict], path: Path) -> None:
    """Every run's training loss (a running mean of SMOOTHING steps) by step: one colour per
    row, solid for the row itself, dashed for its rounding controls."""
    fig, ax = plt.subplots(figsize=(9, 5), layout="constrained")
    colours = {}
    for record in records:
        colour = colours.setdefault(record["variant"], f"C{len(colours) % 10}")
        losses = torch.tensor(record["losses"], dtype=torch.float64)
        window = max(1, min(SMOOTHING, len(losses) // 2))  # a short run still draws a line
        smoothed = losses.unfold(0, window, 1).mean(dim=1)  # (steps - window + 1,)
        first = record["seed"] == records[0]["seed"] and record["control"] == 0
        ax.plot(torch.arange(window, len(losses) + 1).numpy(), smoothed.numpy(), color=colour,
                linestyle="-" if record["control"] == 0 else "--", linewidth=1.0, alpha=0.8,
                label=record["variant"] if first else None)
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss (mean of {SMOOTHING} steps)")
    ax.grid(alpha=0.3)
    ax.legend(title="row (dashed: its controls)")
    seeds = sorted({record["seed"] for record in records})
    fig.suptitle(f"{len(records)} runs: seeds {', '.join(map(str, seeds))}, "
                 f"{max(record['control'] for record in records)} rounding controls each")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_the_study(args: argparse.Namespace, settings: LearnersSettings, plt) -> None:
    """The study: resume from ``study.json``, run what is missing, save after every run, draw
    the loss curves, print the statistic."""
    path = args.out / STUDY_FILE
    try:
        done = recorded_runs(path, settings)
        data = prepare(settings)
    except ValueError as error:
        sys.exit(f"{PROG}: error: {one_line(error)}")
    bars: dict[tuple, tqdm] = {}

    def show(key: tuple, report) -> None:
        if key not in bars:
            bars[key] = tqdm(total=report.steps, desc="/".join(map(str, key)), file=sys.stderr, leave=False)
        bars[key].update()

    def save(records: list[dict]) -> None:
        bars.pop(run_key(records[-1]), tqdm(disable=True)).close()
        saved = {"settings": study_fingerprint(settings), "steps": settings.translation.steps,
                 "torch": torch.__version__, "runs": records}
        write_text(path, json.dumps(saved, indent=1) + "\n")

    records = run_study(settings, data, args.seeds, args.controls, done, on_run=save, on_step=show)
    draw_study_curves(plt, records, args.out / STUDY_PICTURE)
    print(study_table(records))


def write_text(path: Path, text: str) -> None:
    """``text`` to ``path`` through a temporary file beside it: a reader never sees half a file."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def draw_loss_curves(plt, result: LearnersResult, path: Path) -> None:
    """Every row's training loss (a running mean of SMOOTHING steps), by step and by training
    time, overlaid: on the same batches from the same weights the curves should coincide."""
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(13, 4.8), layout="constrained")
    styles = ("-", "--", ":", "-.", (0, (5, 1)))
    for index, row in enumerate(result.rows):
        losses = torch.tensor(row.losses, dtype=torch.float64)
        window = min(SMOOTHING, len(losses))
        smoothed = losses.unfold(0, window, 1).mean(dim=1)  # (steps - window + 1,)
        steps = torch.arange(window, len(losses) + 1)
        seconds = torch.tensor(row.seconds)[window - 1:]
        style = dict(linestyle=styles[index % len(styles)], linewidth=1.4, label=row.variant)
        by_step.plot(steps.numpy(), smoothed.numpy(), **style)
        by_time.plot(seconds.numpy(), smoothed.numpy(), **style)
    by_step.set_xlabel("step")
    by_time.set_xlabel("training time (s)")
    for ax in (by_step, by_time):
        ax.set_ylabel(f"training loss (mean of {SMOOTHING} steps)")
        ax.grid(alpha=0.3)
        ax.legend()
    settings = result.settings
    fig.suptitle(f"One seed, {len(result.rows)} learners: seed {settings.seed}, {result.steps} steps of "
                 f"{settings.translation.batch_tokens} tokens, {settings.dtype}")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    """Parse, check for matplotlib, prepare, train and score every row, writing as each ends."""
    args, settings = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        import matplotlib
    except ImportError:
        sys.exit(f'{PROG}: error: the loss picture needs matplotlib: pip install -e ".[plot]"')
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if args.study:
        run_the_study(args, settings, plt)
        return

    try:
        data = prepare(settings)
    except ValueError as error:
        sys.exit(f"{PROG}: error: {one_line(error)}")
    bars: dict[str, tqdm] = {}

    def show(variant: str, report) -> None:
        if variant not in bars:
            bars[variant] = tqdm(total=report.steps, desc=variant, file=sys.stderr, leave=True)
        bars[variant].set_postfix_str(f"loss {report.loss:.3f}", refresh=False)
        bars[variant].update()

    def save(result: LearnersResult) -> None:
        bars[result.rows[-1].variant].close()
        write_text(args.out / JSON_FILE, json.dumps(as_json(result), indent=1) + "\n")
        write_text(args.out / TABLE_FILE, markdown_report(result))

    result = run_learners(settings, data, on_row=save, on_step=show)
    draw_loss_curves(plt, result, args.out / PICTURE_FILE)
    print(markdown_report(result))


if __name__ == "__main__":
    main()
