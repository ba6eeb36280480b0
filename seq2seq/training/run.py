"""A training run driven to its end, as ``python -m seq2seq.train`` drives it: built fresh or
resumed from the newest checkpoint in its directory, stepped with a progress bar, checkpoints
written when due (the newest N kept), and a last one where a time budget stopped it.

    settings = RunSettings("explicit", steps=300, checkpoint_dir=Path("runs/a"), save_every=100)
    trainer = start(settings, TaskBatches(data), config, Recipe(warmup=100))
    losses, seconds = run_with_checkpoints(settings, trainer, progress=sys.stderr)

Prints nothing of its own: the bar goes to the stream the caller names, and a run that cannot go
on raises ``RunError`` with a one-line message for the command to print.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch
from tqdm import tqdm

from common.checks import check_int
from common.cli import one_line
from seq2seq.storage.model_file import Checkpoint, load_checkpoint, save
from seq2seq.training.distributed import SINGLE, World
from seq2seq.training.recipe import Recipe, StepReport
from seq2seq.training.trainer import Trainer, seed_dropout
from variants import build

OnStep = Callable[[StepReport], None]
CHECKPOINT_NAME = re.compile(r"step-(\d+)\.pt")  # the name of a run's checkpoint: its step


# --- where a run's checkpoints live ------------------------------------------------------


def checkpoint_path(directory: str | os.PathLike, step: int) -> Path:
    """``directory/step-00000300.pt``: the name sorts by step."""
    return Path(directory) / f"step-{step:08d}.pt"


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """The ``step-*.pt`` files in ``directory``, oldest step first (none if it does not exist)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(match.group(1)), path) for path in directory.iterdir()
             if (match := CHECKPOINT_NAME.fullmatch(path.name))]
    return [path for _, path in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike) -> Path:
    """The checkpoint of the highest step in ``directory``; ``ValueError`` if it holds none."""
    found = list_checkpoints(directory)
    if not found:
        raise ValueError(f"no checkpoint (step-*.pt) in {directory}")
    return found[-1]


# --- the run ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSettings:
    """What every run reads, whatever it trains on. ``steps``: in all (a resumed run continues up
    to this many); ``keep_checkpoints``: the newest kept after each save (0 or None keeps all);
    ``overwrite``: delete the earlier run's checkpoints in ``checkpoint_dir``, just before this
    run writes its first.

    Refused when made: a ``keep_checkpoints`` that is not an int (a bool is not one) of at least
    0, and ``resume`` with ``overwrite`` (the checkpoints one continues, the other deletes).
    """

    variant: str
    steps: int
    seed: int = 0
    bf16: bool = False
    bf16_reason: str = ""  # why bf16 is on or off, for the run's first line ("" says nothing)
    checkpoint_dir: Path | None = None
    save_every: int | None = None
    keep_checkpoints: int | None = 5
    resume: bool = False
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.keep_checkpoints is not None:
            check_int("RunSettings.keep_checkpoints", self.keep_checkpoints, low=0)
        if self.resume and self.overwrite:
            raise ValueError("RunSettings.resume continues the checkpoints that RunSettings.overwrite "
                             "deletes: set one of them")


class RunError(Exception):
    """A run that cannot go on (a checkpoint it cannot resume from or write, data it cannot use):
    the message is one line."""


def clear_checkpoints(settings: RunSettings, world: World = SINGLE) -> None:
    """With ``overwrite``, delete the earlier run's checkpoints (rank 0). ``train`` calls it just
    before the run's first save, so a run that fails before (bad data, a vocabulary it cannot
    train, a checkpoint it cannot resume from) deletes nothing."""
    if settings.overwrite and world.is_main:
        for old in list_checkpoints(settings.checkpoint_dir):
            old.unlink(missing_ok=True)


def newest_checkpoint(settings: RunSettings) -> tuple[Path, Checkpoint]:
    """The path of the newest checkpoint in the run's directory, and the checkpoint."""
    path = None
    try:
        path = latest_checkpoint(settings.checkpoint_dir)
        checkpoint = load_checkpoint(path)
    except (OSError, ValueError) as error:
        raise RunError(f"cannot resume from {path or settings.checkpoint_dir}: {one_line(error)}") from error
    return path, checkpoint


def start(settings: RunSettings, batches: Iterator, config: object, recipe: Recipe, *,
          world: World = SINGLE, device: torch.device | None = None,
          newest: tuple[Path, Checkpoint] | None = None) -> Trainer:
    """Build the model and its trainer, then with ``resume`` restore the newest checkpoint
    (``newest``, where the caller has read it already). One that is not this run's, or is at
    ``steps`` already, raises ``RunError`` naming every difference."""
    model = build(settings.variant, config, seed=settings.seed).to(device or torch.device("cpu"))
    trainer = Trainer(model, batches, recipe, world=world, bf16=settings.bf16)
    seed_dropout(settings.seed, world)
    if settings.resume:
        path, checkpoint = newest or newest_checkpoint(settings)
        try:
            trainer.restore(checkpoint, settings.variant)
            if trainer.step >= settings.steps:
                raise ValueError(f"it is at step {trainer.step}; ask for more --steps to continue")
        except (OSError, ValueError) as error:
            raise RunError(f"cannot resume from {path}: {one_line(error)}") from error
    return trainer


def header(settings: RunSettings, trainer: Trainer, what: str) -> str:
    """The run's first line: variant, what it trains, parameters, where, in what precision (and
    why, when the settings say), and a resumed step."""
    world = trainer.world
    where = f"{world.size} processes on {trainer.device.type}" if world.size > 1 else str(trainer.device)
    precision = "bfloat16 autocast" if settings.bf16 else "float32"
    why = f" ({settings.bf16_reason})" if settings.bf16_reason else ""
    resumed = f", resuming at step {trainer.step}" if trainer.step else ""
    parameters = sum(p.numel() for p in trainer.model.parameters())
    return f"{settings.variant}: {what}, {parameters:,} parameters on {where}, {precision}{why}{resumed}"


@contextlib.contextmanager
def progress_bar(steps: int, done: int = 0, minutes: float | None = None, *,
                 file: TextIO) -> Iterator[OnStep]:
    """A tqdm bar on ``file`` for ``Trainer.run``'s ``on_step``: step, loss, learning rate and tokens/s.

    ``done``: steps a resumed run has already taken (the bar starts there). ``minutes``: a time
    budget, which then ends the run long before ``steps``: the line counts steps against it.
    """
    tokens = 0
    bar_format = "[{bar:30}] step {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
    if minutes is not None:  # the budget counts training time; the wall time adds validation and saves
        bar_format = "step {n_fmt} [{postfix}]"
    with tqdm(total=steps, initial=done, file=file, bar_format=bar_format, ascii=".#") as bar:

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


def run_with_checkpoints(settings: RunSettings, trainer: Trainer,
                         run: Callable[[OnStep], list[float]] | None = None, *,
                         progress: TextIO | None = None, minutes: float | None = None,
                         every_step: OnStep | None = None,
                         vocabulary: torch.Tensor | None = None) -> tuple[list[float], float]:
    """``run(on_step)`` (by default ``trainer.run(settings.steps, on_step)``) to its end, then the
    losses and the seconds it took.

    Checkpoints are written when due (every ``save_every`` steps and at the last; every rank takes
    part, rank 0 writes), ``vocabulary`` inside; with ``overwrite``, the earlier run's go just before
    the first. A run that stops early (out of ``minutes``) is saved at its last step. On rank 0,
    ``progress`` (a stream) shows the bar and ``every_step`` runs after each step's save.
    """
    saved = trainer.step
    earlier_run_cleared = not settings.overwrite

    def save_now(step: int) -> None:
        nonlocal saved, earlier_run_cleared
        checkpoint = trainer.checkpoint(settings.variant)  # collective: every rank calls it
        saved = step
        if checkpoint is None:  # not rank 0
            return
        if vocabulary is not None:
            checkpoint = dataclasses.replace(checkpoint, vocabulary=vocabulary)
        path = checkpoint_path(settings.checkpoint_dir, step)
        try:
            if not earlier_run_cleared:  # the run has started: what --overwrite asked for
                clear_checkpoints(settings, trainer.world)
                earlier_run_cleared = True
            save(checkpoint, path)
            if settings.keep_checkpoints:  # only once the newest is safely written
                for old in list_checkpoints(settings.checkpoint_dir)[:-settings.keep_checkpoints]:
                    old.unlink(missing_ok=True)
        except OSError as error:  # a disk that filled up, or a directory removed, mid-run
            raise RunError(f"cannot write {path}: {one_line(error)}") from error

    def on_step(report: StepReport) -> None:
        show(report)
        due = report.step == report.steps or (settings.save_every and report.step % settings.save_every == 0)
        if settings.checkpoint_dir is not None and due:
            save_now(report.step)
        if every_step is not None and trainer.world.is_main:
            every_step(report)

    start_time = time.perf_counter()
    with (progress_bar(settings.steps, trainer.step, minutes, file=progress)
          if progress is not None and trainer.world.is_main else contextlib.nullcontext(None)) as bar:
        show = bar or (lambda report: None)
        try:
            losses = run(on_step) if run is not None else trainer.run(settings.steps, on_step=on_step)
        except FloatingPointError as error:  # a NaN or infinite loss: the last checkpoint stands
            raise RunError(one_line(error)) from error
    if settings.checkpoint_dir is not None and saved != trainer.step:
        save_now(trainer.step)
    return losses, time.perf_counter() - start_time
