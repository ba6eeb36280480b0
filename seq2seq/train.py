"""The command line that trains one variant with the paper's recipe: on a synthetic task, then
reporting held-out exact-sequence accuracy of greedy decoding; or on a real corpus
(``--task translate``), then reporting test BLEU and chrF of greedy and beam-4 decoding.

    python -m seq2seq.train --variant explicit --task reverse --steps 300
    torchrun --standalone --nproc-per-node 2 -m seq2seq.train --checkpoint-dir runs/a --save-every 100
    python -m seq2seq.train --checkpoint-dir runs/a --steps 600 --resume
    python -m seq2seq.train --task translate --data fra-eng.zip --preset cpu --checkpoint-dir runs/fr

A thin shell over the library: ``seq2seq.data`` (the task stream; for translation the corpus,
its vocabulary and batches), ``seq2seq.training`` (the recipe, the run, under torchrun one shard
per process, its checkpoints), ``seq2seq.evaluation`` and ``seq2seq.translation``. It parses the
options once, filling each one not given from a table of defaults (``TASK_DEFAULTS`` for the
synthetic tasks, the chosen ``--preset`` for translation), shows a tqdm progress bar on stderr
(rank 0), writes checkpoints (rank 0), and prints the results on stdout (rank 0).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from tqdm import tqdm

from common.cli import Parser, config_or_exit, device_or_exit, directory_problem, one_line, positive
from seq2seq.data import tasks
from seq2seq.data.batches import TokenBatches, TranslationData, encode_pairs, within
from seq2seq.data.corpus import ATTRIBUTION, CorpusSettings, load_corpus
from seq2seq.data.ids import PAD_ID
from seq2seq.data.subwords import Vocabulary, train_vocabulary
from seq2seq.data.tasks import TaskBatches, TaskData
from seq2seq.evaluation import accuracy_line, held_out_accuracy, score_lines
from seq2seq.training import distributed
from seq2seq.training.checkpoint import (
    Checkpoint,
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save,
)
from seq2seq.training.distributed import World
from seq2seq.training.recipe import Recipe, StepReport
from seq2seq.training.trainer import Trainer, seed_dropout
from seq2seq.translation import (
    PRESETS,
    TranslationSettings,
    evaluate,
    train_translation,
    training_sentences,
    validation_loss,
)
from variants import VARIANTS, build

TRANSLATE = "translate"
# the defaults of the synthetic tasks for the options a translation preset also sets: the
# parser fills each option not given from this table, or from the preset with --task translate
TASK_DEFAULTS: dict[str, object] = {
    "steps": 300, "warmup": 100, "lr_factor": 1.0, "label_smoothing": 0.1, "vocab": 13, "d_model": 64,
    "heads": 4, "layers": 2, "d_ff": 128, "dropout": 0.0, "norm_first": False, "share_embeddings": False,
}
# options only the synthetic tasks read, and only translation reads, with their defaults: one
# given to the other kind of run is a usage error, not silently ignored
TASK_ONLY: dict[str, object] = {"batch": 128, "min_len": 1, "max_len": 10, "eval_size": 1000}
TRANSLATE_ONLY: dict[str, object] = {"data": None, "max_words": 8, "preset": "cpu", "batch_tokens": None,
                                     "minutes": None, "eval_every": None}
KEEP_CHECKPOINTS = 5  # the newest checkpoints kept by default: what python -m seq2seq.average --last reads
# TranslationSettings field -> the option that sets it (and takes the preset's value as default)
PRESET_OPTIONS = {
    "vocabulary_size": "vocab", "d_model": "d_model", "n_heads": "heads", "n_layers": "layers",
    "d_ff": "d_ff", "dropout": "dropout", "norm_first": "norm_first",
    "share_embeddings": "share_embeddings", "batch_tokens": "batch_tokens", "warmup": "warmup",
    "lr_factor": "lr_factor", "label_smoothing": "label_smoothing", "steps": "steps",
    "minutes": "minutes", "eval_every": "eval_every",
}


def defaults(task: str, preset: str) -> dict[str, object]:
    """The value of each option a run takes when it is not given: the tasks' table, or the
    translation preset's settings."""
    if task != TRANSLATE:
        return TASK_DEFAULTS
    return {option: getattr(PRESETS[preset], field) for field, option in PRESET_OPTIONS.items()}


def _default(option: str, text: str = "") -> str:
    """An option's help: its text, the tasks' default, and that translation takes the preset's."""
    return f"{text}{'; ' if text else ''}default {TASK_DEFAULTS[option]}, --task {TRANSLATE}: the preset's"


@contextlib.contextmanager
def progress_bar(steps: int, done: int = 0,
                 minutes: float | None = None) -> Iterator[Callable[[StepReport], None]]:
    """A tqdm bar on stderr for ``Trainer.run``'s ``on_step``: step, loss, learning rate and tokens/s.

    ``done``: steps a resumed run has already taken (the bar starts there). ``minutes``: a time
    budget, which then ends the run long before ``steps``: the line counts steps against it.
    """
    tokens = 0
    bar_format = "[{bar:30}] step {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
    if minutes is not None:  # the budget counts training time; the wall time adds validation and saves
        bar_format = "step {n_fmt} [{postfix}]"
    with tqdm(total=steps, initial=done, file=sys.stderr, bar_format=bar_format, ascii=".#") as bar:

        def show(report: StepReport) -> None:
            nonlocal tokens
            tokens += report.tokens
            rate = tokens / max(report.seconds, 1e-9)
            budget = ""
            if minutes is not None:
                wall = tqdm.format_interval(bar.format_dict["elapsed"])
                budget = (f"training {tqdm.format_interval(report.seconds)} of {minutes:g} min, "
                          f"wall {wall}  ")
            bar.set_postfix_str(f"{budget}loss {report.loss:.4f}  lr {report.lr:.2e}  {rate:,.0f} tok/s",
                                refresh=False)
            bar.update()

        yield show


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, checked by the code that owns each setting, plus ``data``, ``config`` and
    ``recipe`` (and for translation ``corpus`` and ``translation``).

    A bad value is a one-line usage error (exit status 2): ``TaskData`` (through
    ``tasks.check_settings``) checks the task settings, ``TransformerConfig`` the model's,
    ``Recipe`` the optimiser's, ``CorpusSettings`` and ``TranslationSettings`` translation's; the
    device must hold values, and ``--checkpoint-dir`` must take files (it is created here), so
    that no run fails at its first save. With ``--task translate`` the ``--preset`` gives the
    defaults of the model, recipe and run options, and any option given overrides it.
    """
    parser = Parser(
        prog="python -m seq2seq.train",
        description="Train one variant with the paper's recipe on a synthetic task (then report "
                    "held-out exact-sequence accuracy of greedy decoding) or on a translation "
                    "corpus (then report test BLEU and chrF of greedy and beam-4 decoding). Under "
                    "torchrun, each process trains on its share of every batch "
                    "(DistributedDataParallel).",
    )
    parser.add_argument("--variant", choices=VARIANTS, default="explicit")
    parser.add_argument("--task", choices=(*tasks.TASKS, TRANSLATE), default="reverse")
    parser.add_argument("--steps", type=positive(int),
                        help=_default("steps", "steps in all (a resumed run continues up to this many)"))
    parser.add_argument("--batch", type=int, default=None,
                        help="sequences per step, all processes together (default 128)")
    parser.add_argument("--seed", type=int, default=0, help="weights, training data and dropout")
    parser.add_argument("--warmup", type=int,
                        help=_default("warmup", "warm-up steps (the paper: 4000 for 100k steps)"))
    parser.add_argument("--lr-factor", type=float, help=_default("lr_factor"))
    parser.add_argument("--label-smoothing", type=float, help=_default("label_smoothing"))
    parser.add_argument("--vocab", type=int, help=_default("vocab", "vocabulary size, PAD/BOS/EOS included"))
    parser.add_argument("--min-len", type=int, default=None, help="default 1")
    parser.add_argument("--max-len", type=int, default=None, help="default 10")
    for option in ("d_model", "heads", "layers", "d_ff"):
        parser.add_argument(f"--{option.replace('_', '-')}", type=int, help=_default(option))
    parser.add_argument("--dropout", type=float, help=_default("dropout"))
    parser.add_argument("--norm-first", action="store_true", default=None,
                        help=_default("norm_first", "pre-norm instead of post-norm"))
    parser.add_argument("--share-embeddings", action=argparse.BooleanOptionalAction,
                        help=_default("share_embeddings", "one matrix for both embeddings and the "
                                      "generator (paper section 3.4); the tasks' source and target "
                                      "share one vocabulary"))
    parser.add_argument("--bf16", action="store_true",
                        help="forward pass under bfloat16 autocast (CPU or CUDA); off by default")
    parser.add_argument("--eval-size", type=positive(int), default=None,
                        help="held-out sequences (default 1000)")
    parser.add_argument("--device", default="cpu",
                        help="e.g. cpu, cuda, cuda:1 (under torchrun, cuda is each process's own GPU)")
    parser.add_argument("--threads", type=positive(int), default=None,
                        help="CPU threads for torch (default: torch's choice); 1 suits small "
                             "models on a shared machine")
    parser.add_argument("--checkpoint-dir", type=Path, default=None,
                        help="write checkpoints DIR/step-NNNNNNNN.pt (at the last step, and every "
                             "--save-every steps)")
    parser.add_argument("--save-every", type=positive(int), default=None, metavar="STEPS")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest checkpoint in --checkpoint-dir")
    parser.add_argument("--overwrite", action="store_true",
                        help="start afresh in a --checkpoint-dir that holds checkpoints, deleting them "
                             "(without it, or --resume, such a directory is refused)")
    parser.add_argument("--keep-checkpoints", type=int, default=KEEP_CHECKPOINTS, metavar="N",
                        help=f"keep the newest N checkpoints, deleting older ones after each save "
                             f"(default {KEEP_CHECKPOINTS}, what seq2seq.average --last reads; 0 keeps all)")
    translation = parser.add_argument_group(
        "translation (--task translate)",
        "--vocab is the joint subword vocabulary's size; --steps, the model and the recipe "
        "options default to the preset's values")
    translation.add_argument("--data", type=Path, default=None, metavar="PATH",
                             help="a manythings.org export: fra-eng.zip or its fra.txt")
    translation.add_argument("--max-words", type=positive(int), default=None, metavar="N",
                             help="keep English sentences of at most N words (default 8)")
    translation.add_argument("--preset", choices=tuple(PRESETS), default=None,
                             help="model, batches and recipe sized for a 2-core CPU or one GPU")
    translation.add_argument("--batch-tokens", type=positive(int), default=None,
                             help="source + target positions per step, padding included")
    translation.add_argument("--minutes", type=positive(float), default=None,
                             help="stop after this much training time (validation and checkpoint "
                                  "saves not counted; the bar shows both clocks)")
    translation.add_argument("--eval-every", type=positive(int), default=None, metavar="STEPS",
                             help="validation loss and greedy BLEU every STEPS steps")
    args = parser.parse_args(argv)
    translating = args.task == TRANSLATE
    for option in (TASK_ONLY if translating else TRANSLATE_ONLY):
        if getattr(args, option) is not None:
            needs = f"--task {TRANSLATE}" if not translating else "the synthetic tasks"
            parser.error(f"--{option.replace('_', '-')} is for {needs}; --task {args.task} does not read it")
    for option, value in (TRANSLATE_ONLY if translating else TASK_ONLY).items():
        if getattr(args, option) is None:
            setattr(args, option, value)
    for option, value in defaults(args.task, args.preset or "cpu").items():
        if getattr(args, option) is None:
            setattr(args, option, value)
    if (args.resume or args.save_every or args.overwrite) and args.checkpoint_dir is None:
        parser.error("--resume, --save-every and --overwrite need --checkpoint-dir")
    if args.resume and args.overwrite:
        parser.error("--resume continues the checkpoints that --overwrite deletes: give one of them")
    if args.keep_checkpoints < 0:
        parser.error(f"--keep-checkpoints must be at least 0 (0 keeps all), got {args.keep_checkpoints}")
    found = [] if args.checkpoint_dir is None or args.resume else list_checkpoints(args.checkpoint_dir)
    if found and not args.overwrite:
        parser.error(f"--checkpoint-dir {args.checkpoint_dir} holds {len(found)} checkpoints of an "
                     f"earlier run (newest {found[-1].name}): --resume continues it, --overwrite "
                     "deletes them and starts afresh")
    if args.task == TRANSLATE:
        _translation_args(parser, args)
    else:
        _task_args(parser, args)
    args.device = device_or_exit(parser, args.device)
    # last, since it creates the directory: a run must not fail at its first save, hours in
    if args.checkpoint_dir is not None and (problem := directory_problem(args.checkpoint_dir)):
        parser.error(f"--checkpoint-dir {problem}")
    return args


def _task_args(parser: Parser, args: argparse.Namespace) -> None:
    """``data``, ``recipe`` and ``config`` of a synthetic task."""
    try:
        args.data = TaskData(args.task, args.batch, args.vocab, args.min_len, args.max_len, args.seed)
        args.recipe = Recipe(warmup=args.warmup, lr_factor=args.lr_factor,
                             label_smoothing=args.label_smoothing)
    except (TypeError, ValueError) as error:
        parser.error(str(error))
    args.config = config_or_exit(
        parser, d_model=args.d_model, n_heads=args.heads, n_layers=args.layers, d_ff=args.d_ff,
        dropout=args.dropout, src_vocab_size=args.vocab, tgt_vocab_size=args.vocab,
        max_seq_len=args.max_len + 2, norm_first=args.norm_first, pad_id=PAD_ID,
        share_embeddings=args.share_embeddings,
    )  # the longest target is BOS, max_len tokens, EOS


def _translation_args(parser: Parser, args: argparse.Namespace) -> None:
    """``corpus``, ``translation``, ``recipe`` and ``config`` of a translation run."""
    if args.data is None:
        parser.error(f"--task {TRANSLATE} needs --data PATH, a manythings.org export such as "
                     "fra-eng.zip (www.manythings.org/anki)")
    if not args.data.is_file():
        parser.error(f"--data {args.data}: no such file")
    try:
        args.corpus = CorpusSettings(str(args.data), max_words=args.max_words, split_seed=0)
        args.translation = PRESETS[args.preset].replace(
            **{field: getattr(args, option) for field, option in PRESET_OPTIONS.items()})
        args.recipe = args.translation.recipe()
        args.config = args.translation.config()  # the model's, built once
    except (TypeError, ValueError) as error:
        parser.error(str(error))


def main(argv: list[str] | None = None) -> None:
    """Parse; join the process group (under torchrun); build or resume; train with a progress
    bar and checkpoints; evaluate held out and report (rank 0 only)."""
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    world = World.from_environment()
    if args.overwrite and world.is_main:  # asked for: the earlier run's checkpoints go
        for old in list_checkpoints(args.checkpoint_dir):
            old.unlink(missing_ok=True)
    device = distributed.device_for(args.device, world)
    with distributed.process_group(world, device):
        if args.task == TRANSLATE:
            _translate(args, world, device)
            return
        trainer = _start(args, world, device)
        start = time.perf_counter()
        losses = _train(args, trainer, lambda on_step: trainer.run(args.steps, on_step=on_step))
        seconds = time.perf_counter() - start
        if world.is_main:
            _report(args, trainer, losses, seconds)


def _start(args: argparse.Namespace, world: World, device: torch.device) -> Trainer:
    """Build the model and its trainer: fresh, or from the newest checkpoint with ``--resume``."""
    model = build(args.variant, args.config, seed=args.seed).to(device)
    trainer = Trainer(model, TaskBatches(args.data), args.recipe, world=world, bf16=args.bf16)
    seed_dropout(args.seed, world)
    if args.resume:
        _resume(args, trainer)
    _header(args, trainer, f"{args.task}, {args.steps} steps of {args.batch} sequences")
    return trainer


def _header(args: argparse.Namespace, trainer: Trainer, what: str) -> None:
    """The run's first line, on stderr (rank 0)."""
    if trainer.world.is_main:
        world = trainer.world
        where = f"{world.size} processes on {trainer.device.type}" if world.size > 1 else str(trainer.device)
        resumed = f", resuming at step {trainer.step}" if trainer.step else ""
        parameters = sum(p.numel() for p in trainer.model.parameters())
        print(f"{args.variant}: {what}, {parameters:,} parameters on {where}{resumed}", file=sys.stderr)


def _resume(args: argparse.Namespace, trainer: Trainer, checkpoint: Checkpoint | None = None) -> None:
    """Restore the newest checkpoint in ``--checkpoint-dir`` (or ``checkpoint``, read from it
    already); one that is not this run's, or is already at ``--steps``, ends the program with
    status 1 (rank 0 says why, naming every difference)."""
    path = None
    try:
        path = latest_checkpoint(args.checkpoint_dir)
        trainer.restore(checkpoint or load_checkpoint(path), args.variant)
        if trainer.step >= args.steps:
            raise ValueError(f"it is at step {trainer.step}; ask for more --steps to continue")
    except (OSError, ValueError) as error:
        _resume_failed(args, path, error, trainer.world)


def _resume_failed(args: argparse.Namespace, path: Path | None, error: BaseException, world: World) -> None:
    source = path or args.checkpoint_dir
    message = f"python -m seq2seq.train: error: cannot resume from {source}: {one_line(error)}"
    sys.exit(message if world.is_main else 1)


def _train(args: argparse.Namespace, trainer: Trainer,
           run: Callable[[Callable[[StepReport], None]], list[float]],
           vocabulary: Vocabulary | None = None,
           every_step: Callable[[StepReport], None] | None = None) -> list[float]:
    """``run(on_step)`` to its end; rank 0 draws the bar and writes the checkpoints (every rank
    helps), with ``vocabulary`` inside; ``every_step`` runs after each step's save, on rank 0.
    A run that stops before ``report.steps`` (out of minutes) is saved at its last step."""
    saved = trainer.step

    def save_now(step: int) -> None:
        nonlocal saved
        checkpoint = trainer.checkpoint(args.variant)  # collective: every rank calls it
        saved = step
        if checkpoint is not None:
            if vocabulary is not None:
                checkpoint = dataclasses.replace(checkpoint, vocabulary=vocabulary.to_tensor())
            path = checkpoint_path(args.checkpoint_dir, step)
            try:
                save(checkpoint, path)
                if args.keep_checkpoints:  # only once the newest is safely written
                    for old in list_checkpoints(args.checkpoint_dir)[:-args.keep_checkpoints]:
                        old.unlink(missing_ok=True)
            except OSError as error:  # a disk that filled up, or a directory removed, mid-run
                sys.exit(f"python -m seq2seq.train: error: cannot write {path}: {one_line(error)}")

    def save_when_due(report: StepReport) -> None:
        due = report.step == report.steps or (args.save_every and report.step % args.save_every == 0)
        if args.checkpoint_dir is not None and due:
            save_now(report.step)

    if not trainer.world.is_main:
        losses = run(save_when_due)
    else:
        minutes = args.translation.minutes if args.task == TRANSLATE else None
        with progress_bar(args.steps, done=trainer.step, minutes=minutes) as show_step:

            def on_step(report: StepReport) -> None:
                show_step(report)
                save_when_due(report)
                if every_step is not None:
                    every_step(report)

            losses = run(on_step)
    if args.checkpoint_dir is not None and saved != trainer.step:
        save_now(trainer.step)
    return losses


# --- translation -----------------------------------------------------------------------------


def _translate(args: argparse.Namespace, world: World, device: torch.device) -> None:
    """Load the corpus; train its vocabulary (or take the checkpoint's); train with periodic
    validation; report test BLEU and chrF, greedy and beam 4 (rank 0)."""
    settings: TranslationSettings = args.translation
    try:
        corpus = load_corpus(args.corpus)
    except ValueError as error:
        sys.exit(f"python -m seq2seq.train: error: {one_line(error)}")
    checkpoint, path = None, None
    if args.resume:  # the vocabulary is the checkpoint's: the model's ids mean its pieces
        try:
            path = latest_checkpoint(args.checkpoint_dir)
            checkpoint = load_checkpoint(path)
            if checkpoint.vocabulary is None:
                raise ValueError("it holds no subword vocabulary (not a translation run)")
            vocabulary = Vocabulary.from_tensor(checkpoint.vocabulary)
        except (OSError, ValueError) as error:
            _resume_failed(args, path, error, world)
    else:
        try:  # e.g. a vocabulary larger than a small corpus can fill
            vocabulary = train_vocabulary(training_sentences(corpus), settings.vocabulary_settings())
        except ValueError as error:
            sys.exit(f"python -m seq2seq.train: error: {one_line(error)}; a smaller --vocab, "
                     "or a larger corpus")
    data = TranslationData(args.corpus, settings.vocabulary_settings(), settings.batch_tokens,
                           settings.pool_size, args.seed)
    max_len = settings.max_seq_len
    for name in ("valid", "test"):  # sources it will translate: each must fit the model
        sources = vocabulary.encode([example.source for example in corpus.split(name)])
        if (longest := max(len(ids) + 1 for ids in sources)) > max_len:
            sys.exit(f"python -m seq2seq.train: error: a {name} sentence is {longest} pieces long with EOS, "
                     f"more than the model's max_seq_len {max_len}: a smaller --max-words")
    try:  # pairs longer than the model reads or writes are left out of training and validation
        train, long_train = within(encode_pairs(vocabulary, corpus.pairs("train")), max_len)
        batches = TokenBatches(train, data)
    except ValueError as error:
        sys.exit(f"python -m seq2seq.train: error: {one_line(error)}")
    model = build(args.variant, args.config, seed=args.seed).to(device)
    trainer = Trainer(model, batches, args.recipe, world=world, bf16=args.bf16)
    seed_dropout(args.seed, world)
    if args.resume:
        _resume(args, trainer, checkpoint)
    limit = f" (at most {settings.minutes:g} minutes)" if settings.minutes else ""
    _header(args, trainer, f"translate {Path(args.corpus.path).name}, {len(corpus.train):,} train / "
                           f"{len(corpus.valid):,} valid / {len(corpus.test):,} test English sentences, "
                           f"{vocabulary.size} subwords, {settings.steps} steps{limit} of "
                           f"{settings.batch_tokens} tokens")
    valid, long_valid = within(encode_pairs(vocabulary, corpus.pairs("valid")), max_len)
    if (long := long_train + long_valid) and world.is_main:
        print(f"{long} train or valid pairs longer than max_seq_len {max_len} left out of training and "
              "validation loss (the test scores keep every reference)", file=sys.stderr)
    normalization = args.corpus.normalization

    def validate(report: StepReport) -> None:
        if report.step % settings.eval_every == 0 and valid.sources:
            loss = validation_loss(trainer.model, valid, settings.batch_tokens)
            scores = evaluate(trainer.model, vocabulary, corpus.valid, beam_sizes=(1,),
                              normalization=normalization)[1]
            tqdm.write(f"step {report.step} ({report.seconds / 60:.1f} min): valid loss {loss:.4f}, "
                       f"greedy BLEU {scores.bleu:.2f}, "
                       f"chrF {scores.chrf:.2f}", file=sys.stderr)

    start = time.perf_counter()
    losses = _train(args, trainer, lambda on_step: train_translation(trainer, settings, on_step),
                    vocabulary, every_step=validate)
    seconds = time.perf_counter() - start
    if world.is_main:
        last = losses[-10:] or [float("nan")]
        print(f"final loss {sum(last) / len(last):.4f} (mean of the last {len(last)} steps), "
              f"{trainer.step} steps, trained in {seconds:.1f} s")
        scores = evaluate(trainer.model, vocabulary, corpus.test, normalization=normalization)
        references = sum(len(example.references) for example in corpus.test)
        print(f"test split: {len(corpus.test):,} English sentences of at most {args.corpus.max_words} "
              f"words, {references:,} French references (data: {ATTRIBUTION})")
        for line in score_lines(scores):
            print(line)


def _report(args: argparse.Namespace, trainer: Trainer, losses: list[float], seconds: float) -> None:
    """The final loss and the held-out accuracy, on stdout."""
    accuracy = held_out_accuracy(trainer.model, args.data, args.eval_size)
    last = losses[-10:]
    print(f"final loss {sum(last) / len(last):.4f} (mean of the last {len(last)} steps), "
          f"trained in {seconds:.1f} s")
    print(accuracy_line(accuracy, args.eval_size, args.task))


if __name__ == "__main__":
    main()
