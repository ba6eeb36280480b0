"""The command line that trains one variant with the paper's recipe: on a synthetic task, then
reporting held-out exact-sequence accuracy of greedy decoding; or on a real corpus
(``--task translate``), then reporting test BLEU and chrF of greedy and beam-4 decoding.

    python -m seq2seq.train --variant explicit --task reverse --steps 300
    torchrun --standalone --nproc-per-node 2 -m seq2seq.train --checkpoint-dir runs/a --save-every 100
    python -m seq2seq.train --checkpoint-dir runs/a --steps 600 --resume
    python -m seq2seq.train --task translate --data fra-eng.zip --preset cpu --checkpoint-dir runs/fr

This file is the command line only: options (``seq2seq.options.add_options``, each one not
given filled from ``TASK_DEFAULTS`` or the ``--preset``) -> ``TrainSettings`` -> the run,
``seq2seq.training.run``'s (or ``seq2seq.pipeline.run_translation``); rank 0 prints its remarks
and bar on stderr and its report on stdout.
"""

from __future__ import annotations

import sys

import torch
from tqdm import tqdm

from common.cli import Parser
from seq2seq.data.tasks import TaskBatches
from seq2seq.evaluation import accuracy_line, held_out_accuracy, loss_line
from seq2seq.options import TRANSLATE, TrainSettings, add_options, settings_from_options
from seq2seq.pipeline import run_translation
from seq2seq.training import distributed, run
from seq2seq.training.distributed import World
from seq2seq.training.run import RunError


def parse_args(argv: list[str] | None = None) -> TrainSettings:
    """The run's settings (``seq2seq.options``), every value checked before any work. A bad
    value is a one-line usage error (exit status 2), said by the code that owns the setting."""
    parser = Parser(prog="python -m seq2seq.train", description="Train one variant with the paper's recipe "
                    "on a synthetic task or a translation corpus (under torchrun, with DDP), then score it.")
    add_options(parser)
    args = parser.parse_args(argv)
    try:
        return settings_from_options(args)
    except ValueError as error:
        parser.error(str(error))


def note(line: str) -> None:
    """A remark of the run on stderr, above the progress bar."""
    tqdm.write(line, file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    """Parse; join the process group (under torchrun); train (``seq2seq.training.run``, or
    ``seq2seq.pipeline.run_translation``); print the report (rank 0 only). A run that cannot
    go on ends with status 1 and one line (rank 0)."""
    settings = parse_args(argv)
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    world = World.from_environment()
    device = distributed.device_for(settings.device, world)
    progress = sys.stderr if world.is_main else None
    with distributed.process_group(world, device):
        try:
            if settings.task == TRANSLATE:
                lines = run_translation(settings.run, settings.translation, settings.corpus, settings.config,
                                        world=world, device=device, progress=progress, note=note)
            else:
                data, size = settings.data, settings.eval_size
                trainer = run.start(settings.run, TaskBatches(data), settings.config, settings.recipe,
                                    world=world, device=device)
                if world.is_main:
                    note(run.header(settings.run, trainer, f"{settings.task}, {settings.steps} steps of "
                                                           f"{data.batch_size} sequences"))
                losses, seconds = run.run_with_checkpoints(settings.run, trainer, progress=progress)
                accuracy = held_out_accuracy(trainer.model, data, size) if world.is_main else 0
                lines = [loss_line(losses, seconds), accuracy_line(accuracy, size, settings.task)]
        except RunError as error:
            sys.exit(f"python -m seq2seq.train: error: {error}" if world.is_main else 1)
    if world.is_main:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
