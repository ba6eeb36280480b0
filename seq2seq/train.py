"""The command line that trains one variant with the paper's recipe: on a synthetic task, then
reporting held-out exact-sequence accuracy of greedy decoding; or on a real corpus
(``--task translate``), then reporting test BLEU and chrF of greedy and beam-4 decoding.

    python -m seq2seq.train --variant explicit --task reverse --steps 300
    torchrun --standalone --nproc-per-node 2 -m seq2seq.train --checkpoint-dir runs/a --save-every 100
    python -m seq2seq.train --checkpoint-dir runs/a --steps 600 --resume
    python -m seq2seq.train --task translate --data fra-eng.zip --preset cpu --checkpoint-dir runs/fr

It parses the options once, filling each one not given from ``TASK_DEFAULTS`` (the synthetic
tasks) or the ``--preset`` (translation); the run is ``seq2seq.training.run``'s (or
``seq2seq.pipeline.run_translation``); rank 0 prints its remarks and bar on stderr and its
report on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from common.cli import Parser, config_or_exit, device_or_exit, directory_problem, positive
from seq2seq.data import tasks
from seq2seq.data.corpus import CorpusSettings
from seq2seq.data.ids import PAD_ID
from seq2seq.data.tasks import TaskBatches, TaskData
from seq2seq.evaluation import accuracy_line, held_out_accuracy, loss_line
from seq2seq.pipeline import TRAINING_PRESETS, run_translation
from seq2seq.training import distributed, run
from seq2seq.training.distributed import World
from seq2seq.training.recipe import Recipe
from seq2seq.training.run import RunError, RunSettings, list_checkpoints
from variants import VARIANTS

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
RENAMED = {"vocab": "vocabulary_size", "heads": "n_heads", "layers": "n_layers"}
PRESET_OPTIONS = {RENAMED.get(option, option): option
                  for option in (*TASK_DEFAULTS, "batch_tokens", "minutes", "eval_every")}


def defaults(task: str, preset: str) -> dict[str, object]:
    """The value of each option a run takes when it is not given: the tasks' table, or the
    translation preset's settings."""
    if task != TRANSLATE:
        return TASK_DEFAULTS
    return {option: getattr(TRAINING_PRESETS[preset], field) for field, option in PRESET_OPTIONS.items()}


def _default(option: str, text: str = "") -> str:
    """An option's help: its text, the tasks' default, and that translation takes the preset's."""
    return f"{text}{'; ' if text else ''}default {TASK_DEFAULTS[option]}, --task {TRANSLATE}: the preset's"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, checked by the code that owns each setting, plus ``data``, ``config`` and
    ``recipe`` (and for translation ``corpus`` and ``translation``).

    A bad value is a one-line usage error (exit status 2): ``TaskData`` (through
    ``tasks.check_settings``) checks the task settings, ``TransformerConfig`` the model's,
    ``Recipe`` the optimiser's, ``CorpusSettings`` and ``TranslationSettings`` translation's; the
    device must hold values, and ``--checkpoint-dir`` must take files (it is created here, but
    never for ``--resume``, which needs a folder of checkpoints), so that no run fails at its
    first save. With ``--task translate`` the ``--preset`` gives the defaults of the model,
    recipe and run options, and any option given overrides it.
    """
    parser = Parser(prog="python -m seq2seq.train", description="Train one variant with the paper's recipe "
                    "on a synthetic task or a translation corpus (under torchrun, with DDP), then score it.")
    parser.add_argument("--variant", choices=VARIANTS, default="explicit")
    parser.add_argument("--task", choices=(*tasks.TASKS, TRANSLATE), default="reverse")
    parser.add_argument("--steps", type=positive(int),
                        help=_default("steps", "steps in all (a resumed run continues up to this many)"))
    parser.add_argument("--batch", type=int, help="sequences per step, all processes together (default 128)")
    parser.add_argument("--seed", type=int, default=0, help="weights, training data and dropout")
    parser.add_argument("--warmup", type=int,
                        help=_default("warmup", "warm-up steps (the paper: 4000 for 100k steps)"))
    parser.add_argument("--lr-factor", type=float, help=_default("lr_factor"))
    parser.add_argument("--label-smoothing", type=float, help=_default("label_smoothing"))
    parser.add_argument("--vocab", type=int, help=_default("vocab", "vocabulary size, PAD/BOS/EOS included"))
    parser.add_argument("--min-len", type=int, help="default 1")
    parser.add_argument("--max-len", type=int, help="default 10")
    for option in ("d_model", "heads", "layers", "d_ff"):
        parser.add_argument(f"--{option.replace('_', '-')}", type=int, help=_default(option))
    parser.add_argument("--dropout", type=float, help=_default("dropout"))
    parser.add_argument("--norm-first", action="store_true", default=None,
                        help=_default("norm_first", "pre-norm instead of post-norm"))
    parser.add_argument("--share-embeddings", action=argparse.BooleanOptionalAction, help=_default(
        "share_embeddings", "one matrix for both embeddings and the generator (paper section 3.4)"))
    parser.add_argument("--bf16", action="store_true",
                        help="forward pass under bfloat16 autocast (CPU or CUDA); off by default")
    parser.add_argument("--eval-size", type=positive(int), help="held-out sequences (default 1000)")
    parser.add_argument("--device", default="cpu",
                        help="e.g. cpu, cuda, cuda:1 (under torchrun, cuda is each process's own GPU)")
    parser.add_argument("--threads", type=positive(int), help="CPU threads for torch (default: torch's)")
    parser.add_argument("--checkpoint-dir", type=Path, help="write DIR/step-NNNNNNNN.pt (at the end, "
                                                             "and every --save-every steps)")
    parser.add_argument("--save-every", type=positive(int), default=None, metavar="STEPS")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest checkpoint in --checkpoint-dir")
    parser.add_argument("--overwrite", action="store_true",
                        help="start afresh in a --checkpoint-dir that holds checkpoints, deleting them "
                             "just before the first new one is written")
    parser.add_argument("--keep-checkpoints", type=int, default=KEEP_CHECKPOINTS, metavar="N",
                        help=f"keep the newest N checkpoints (default {KEEP_CHECKPOINTS}; 0 keeps all)")
    translation = parser.add_argument_group(
        "translation (--task translate)",
        "--vocab is the joint subword vocabulary's size; --steps, the model and the recipe "
        "options default to the preset's values")
    translation.add_argument("--data", type=Path, default=None, metavar="PATH",
                             help="a manythings.org export: fra-eng.zip or its fra.txt")
    translation.add_argument("--max-words", type=positive(int), default=None, metavar="N",
                             help="keep English sentences of at most N words (default 8)")
    translation.add_argument("--preset", choices=tuple(TRAINING_PRESETS), default=None,
                             help="model, batches and recipe sized for a 2-core CPU or one GPU")
    translation.add_argument("--batch-tokens", type=positive(int), default=None,
                             help="source + target positions per step, padding included")
    translation.add_argument("--minutes", type=positive(float),
                             help="stop after this much training time (validation and saves not counted)")
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
    if args.resume:
        _resume_args(parser, args.checkpoint_dir)
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


def _resume_args(parser: Parser, directory: Path) -> None:
    """Refuse ``--resume`` from a folder that is missing (it is not created) or holds no
    checkpoint, before any work."""
    if not directory.is_dir():
        parser.error(f"--checkpoint-dir {directory}: no such directory; --resume continues the "
                     "checkpoints of a run written there")
    if not list_checkpoints(directory):
        parser.error(f"--checkpoint-dir {directory} holds no checkpoint (step-*.pt) for --resume "
                     "to continue")


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
        args.translation = TRAINING_PRESETS[args.preset].replace(
            **{field: getattr(args, option) for field, option in PRESET_OPTIONS.items()})
        args.recipe = args.translation.recipe()
        args.config = args.translation.config()  # the model's, built once
    except (TypeError, ValueError) as error:
        parser.error(str(error))


def note(line: str) -> None:
    """A remark of the run on stderr, above the progress bar."""
    tqdm.write(line, file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    """Parse; join the process group (under torchrun); train (``seq2seq.training.run``, or
    ``seq2seq.pipeline.run_translation``); print the report (rank 0 only). A run that cannot
    go on ends with status 1 and one line (rank 0)."""
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    world = World.from_environment()
    # options of the same names; with --overwrite, the run's first save deletes the earlier run's
    settings = RunSettings(**{field.name: getattr(args, field.name)
                              for field in dataclasses.fields(RunSettings)})
    device = distributed.device_for(args.device, world)
    progress = sys.stderr if world.is_main else None
    with distributed.process_group(world, device):
        try:
            if args.task == TRANSLATE:
                lines = run_translation(settings, args.translation, args.corpus, args.config, world=world,
                                        device=device, progress=progress, note=note)
            else:
                trainer = run.start(settings, TaskBatches(args.data), args.config, args.recipe,
                                    world=world, device=device)
                if world.is_main:
                    note(run.header(settings, trainer, f"{args.task}, {args.steps} steps of {args.batch} "
                                                       "sequences"))
                losses, seconds = run.run_with_checkpoints(settings, trainer, progress=progress)
                accuracy = held_out_accuracy(trainer.model, args.data, args.eval_size) if world.is_main else 0
                lines = [loss_line(losses, seconds), accuracy_line(accuracy, args.eval_size, args.task)]
        except RunError as error:
            sys.exit(f"python -m seq2seq.train: error: {error}" if world.is_main else 1)
    if world.is_main:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
