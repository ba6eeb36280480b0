"""The options of ``python -m seq2seq.train`` and the settings they make: ``add_options``
declares them, ``settings_from_options`` turns the parsed ones into a frozen ``TrainSettings``,
every value checked before any work (a ValueError, which the command prints as a usage error).

    parser = Parser(prog="python -m seq2seq.train")
    add_options(parser)
    settings = settings_from_options(parser.parse_args(argv))  # ValueError -> parser.error

An option not given takes its value from ``TASK_DEFAULTS`` (the synthetic tasks) or the
``--preset`` (``--task translate``); one that only the other kind of run reads is refused. The
values are checked by the code that owns each setting (``TaskData``, ``TransformerConfig``,
``Recipe``, ``CorpusSettings``, ``TranslationSettings``), not here again.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NoReturn

import torch

from common.bfloat16 import bfloat16_support
from common.cli import device_or_exit, directory_problem, positive, seed_int
from common.config import TransformerConfig
from seq2seq.data import tasks
from seq2seq.data.corpus import CorpusSettings
from seq2seq.data.ids import PAD_ID
from seq2seq.data.tasks import TaskData
from seq2seq.pipeline import TRAINING_PRESETS, TranslationSettings
from seq2seq.training.recipe import Recipe
from seq2seq.training.run import RunSettings, list_checkpoints
from variants import VARIANTS

TRANSLATE = "translate"
# the defaults of the synthetic tasks for the options a translation preset also sets: each
# option not given takes its value from this table, or from the preset with --task translate
TASK_DEFAULTS: dict[str, object] = {
    "steps": 300, "warmup": 100, "lr_factor": 1.0, "label_smoothing": 0.1, "vocab": 13, "d_model": 64,
    "heads": 4, "layers": 2, "d_ff": 128, "dropout": 0.0, "norm_first": False, "share_embeddings": False,
    "final_norm": True, "norm_eps": 1e-6,
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


@dataclass(frozen=True)
class TrainSettings:
    """What one ``python -m seq2seq.train`` run is asked to do: a synthetic task's ``data`` and
    ``eval_size``, or translation's ``corpus`` and ``translation`` (its preset with the options
    given); the model's ``config`` and the ``recipe`` of either, built once."""

    run: RunSettings  # the variant, steps, seed, bf16 and checkpoints
    task: str  # a synthetic task (seq2seq.data.tasks.TASKS) or TRANSLATE
    config: TransformerConfig
    recipe: Recipe
    device: torch.device  # usable here; under torchrun, cuda is each process's own GPU
    threads: int | None = None  # CPU threads for torch; None: torch's own
    data: TaskData | None = None  # the synthetic task's training stream
    eval_size: int | None = None  # the synthetic task's held-out sequences
    corpus: CorpusSettings | None = None
    translation: TranslationSettings | None = None

    # the values of the options of these names, as the run holds them
    @property
    def steps(self) -> int:
        return self.run.steps

    @property
    def bf16(self) -> bool:
        return self.run.bf16

    @property
    def d_model(self) -> int:
        return self.config.d_model

    @property
    def share_embeddings(self) -> bool:
        return self.config.share_embeddings


def defaults(task: str, preset: str) -> dict[str, object]:
    """The value of each option a run takes when it is not given: the tasks' table, or the
    translation preset's settings."""
    if task != TRANSLATE:
        return TASK_DEFAULTS
    return {option: getattr(TRAINING_PRESETS[preset], field) for field, option in PRESET_OPTIONS.items()}


def _default(option: str, text: str = "") -> str:
    """An option's help: its text, the tasks' default, and that translation takes the preset's."""
    return f"{text}{'; ' if text else ''}default {TASK_DEFAULTS[option]}, --task {TRANSLATE}: the preset's"


def add_options(parser: argparse.ArgumentParser) -> None:
    """The command's options, each with its help; those a preset also sets default to None (not
    given), which ``settings_from_options`` fills."""
    parser.add_argument("--variant", choices=VARIANTS, default="explicit")
    parser.add_argument("--task", choices=(*tasks.TASKS, TRANSLATE), default="reverse")
    parser.add_argument("--steps", type=positive(int),
                        help=_default("steps", "steps in all (a resumed run continues up to this many)"))
    parser.add_argument("--batch", type=int, help="sequences per step, all processes together (default 128)")
    parser.add_argument("--seed", type=seed_int, default=0,
                        help="weights, training data and dropout, 0..2**32-1 (default 0)")
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
    parser.add_argument("--final-norm", action=argparse.BooleanOptionalAction, help=_default(
        "final_norm", "a LayerNorm after each stack, as torch.nn.Transformer; --no-final-norm: none, as "
        "the paper's post-norm model and Marian (python -m seq2seq.export_hf needs it)"))
    parser.add_argument("--norm-eps", type=float, help=_default(
        "norm_eps", "LayerNorm's eps (Marian's, for python -m seq2seq.export_hf: 1e-5)"))
    parser.add_argument("--share-embeddings", action=argparse.BooleanOptionalAction, help=_default(
        "share_embeddings", "one matrix for both embeddings and the generator (paper section 3.4)"))
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction,
                        help="forward pass under bfloat16 autocast (CPU or CUDA); default: on for --task "
                             f"{TRANSLATE} on a CPU that multiplies bfloat16 natively (avx512_bf16 or "
                             "amx_bf16), else off")
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
                             help="stop after this much training time (validation and saves not counted); "
                                  "the test split's scoring, greedy and beam 4, follows outside it (a few "
                                  "minutes on a 2-core CPU for the cpu preset)")
    translation.add_argument("--eval-every", type=positive(int), default=None, metavar="STEPS",
                             help="validation loss and greedy BLEU every STEPS steps")


def settings_from_options(args: argparse.Namespace) -> TrainSettings:
    """The parsed options (left as they are) as the run's ``TrainSettings``, every value checked
    before any work; ValueError names the first that cannot run, in one line.

    Refused: an option the task does not read; ``--resume``, ``--save-every`` or ``--overwrite``
    without ``--checkpoint-dir``; ``--resume`` from a folder without checkpoints, and a fresh run
    into one holding another run's, unless ``--overwrite``; a value its owner refuses; a device
    that cannot hold values; a ``--checkpoint-dir`` that cannot take files. That last check
    creates the folder (never for ``--resume``, which needs it), so that no run fails at its
    first save, hours in.
    """
    translating = args.task == TRANSLATE
    for option in (TASK_ONLY if translating else TRANSLATE_ONLY):
        if getattr(args, option) is not None:
            needs = f"--task {TRANSLATE}" if not translating else "the synthetic tasks"
            raise ValueError(f"--{option.replace('_', '-')} is for {needs}; "
                             f"--task {args.task} does not read it")
    filled = {**(TRANSLATE_ONLY if translating else TASK_ONLY), **defaults(args.task, args.preset or "cpu")}
    options = argparse.Namespace(**{name: filled[name] if value is None and name in filled else value
                                    for name, value in vars(args).items()})
    _check_checkpoint_options(options)
    device = device_or_exit(_Raise, options.device)
    options.bf16, options.bf16_reason = bf16_choice(args.bf16, translating, device)
    # options of the same names; with --overwrite, the run's first save deletes the earlier run's
    run = RunSettings(**{field.name: getattr(options, field.name) for field in fields(RunSettings)})
    parts = _translation_settings(options) if translating else _task_settings(options)
    if options.checkpoint_dir is not None and (problem := directory_problem(options.checkpoint_dir)):
        raise ValueError(f"--checkpoint-dir {problem}")
    return TrainSettings(run=run, task=options.task, device=device, threads=options.threads, **parts)


def bf16_choice(asked: bool | None, translating: bool, device: torch.device) -> tuple[bool, str]:
    """Whether the run trains under bfloat16 autocast, and why, for its first line: as asked
    (``--bf16``/``--no-bf16``); unasked, on for translation on a CPU that multiplies bfloat16
    natively (``common.bfloat16``), where it trains about 1.6x the steps in the same minutes
    (docs/results/cpu-translation-bf16.md); off for the synthetic tasks and off the CPU."""
    if asked is not None:
        return asked, "--bf16" if asked else "--no-bf16"
    if not translating:
        return False, ""
    if device.type != "cpu":
        return False, "the bfloat16 default is the CPU's; --bf16 asks for it"
    support = bfloat16_support("cpu")
    return support.native, support.reason


class _Raise:
    """Stands in for the parser ``common.cli.device_or_exit`` reports to: its one line raised
    as ValueError, for the command to print as its own usage error."""

    @staticmethod
    def error(message: str) -> NoReturn:
        raise ValueError(message)


def _check_checkpoint_options(options: argparse.Namespace) -> None:
    """Refuse checkpoint options that cannot go together, ``--resume`` with nothing to continue
    (a missing folder is not created) and a fresh run into another run's checkpoints."""
    directory = options.checkpoint_dir
    if (options.resume or options.save_every or options.overwrite) and directory is None:
        raise ValueError("--resume, --save-every and --overwrite need --checkpoint-dir")
    if options.resume and options.overwrite:
        raise ValueError("--resume continues the checkpoints that --overwrite deletes: give one of them")
    if options.keep_checkpoints < 0:
        raise ValueError("--keep-checkpoints must be at least 0 (0 keeps all), "
                         f"got {options.keep_checkpoints}")
    if options.resume and not directory.is_dir():
        raise ValueError(f"--checkpoint-dir {directory}: no such directory; --resume continues the "
                         "checkpoints of a run written there")
    if options.resume and not list_checkpoints(directory):
        raise ValueError(f"--checkpoint-dir {directory} holds no checkpoint (step-*.pt) for --resume "
                         "to continue")
    found = [] if directory is None or options.resume else list_checkpoints(directory)
    if found and not options.overwrite:
        raise ValueError(f"--checkpoint-dir {directory} holds {len(found)} checkpoints of an "
                         f"earlier run (newest {found[-1].name}): --resume continues it, --overwrite "
                         "deletes them and starts afresh")


def _task_settings(options: argparse.Namespace) -> dict[str, object]:
    """``data``, ``eval_size``, ``recipe`` and ``config`` of a synthetic task."""
    try:
        return dict(
            data=TaskData(options.task, options.batch, options.vocab, options.min_len, options.max_len,
                          options.seed),
            eval_size=options.eval_size,
            recipe=Recipe(warmup=options.warmup, lr_factor=options.lr_factor,
                          label_smoothing=options.label_smoothing),
            config=TransformerConfig(
                d_model=options.d_model, n_heads=options.heads, n_layers=options.layers, d_ff=options.d_ff,
                dropout=options.dropout, src_vocab_size=options.vocab, tgt_vocab_size=options.vocab,
                max_seq_len=options.max_len + 2, norm_first=options.norm_first, pad_id=PAD_ID,
                share_embeddings=options.share_embeddings, final_norm=options.final_norm,
                norm_eps=options.norm_eps,
            ))  # the longest target is BOS, max_len tokens, EOS
    except TypeError as error:
        raise ValueError(str(error)) from error


def _translation_settings(options: argparse.Namespace) -> dict[str, object]:
    """``corpus``, ``translation``, ``recipe`` and ``config`` of a translation run."""
    if options.data is None:
        raise ValueError(f"--task {TRANSLATE} needs --data PATH, a manythings.org export such as "
                         "fra-eng.zip (www.manythings.org/anki)")
    if not options.data.is_file():
        raise ValueError(f"--data {options.data}: no such file")
    try:
        corpus = CorpusSettings(str(options.data), max_words=options.max_words, split_seed=0)
        translation = TRAINING_PRESETS[options.preset].replace(
            **{field: getattr(options, option) for field, option in PRESET_OPTIONS.items()})
        # the model's config, built once
        return dict(corpus=corpus, translation=translation, recipe=translation.recipe(),
                    config=translation.config())
    except TypeError as error:
        raise ValueError(str(error)) from error
