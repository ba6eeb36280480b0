"""The command line that trains one variant on a synthetic task with the paper's recipe, then
reports held-out exact-sequence accuracy of greedy decoding.

    python -m seq2seq.train --variant explicit --task reverse --steps 300
    torchrun --standalone --nproc-per-node 2 -m seq2seq.train --checkpoint-dir runs/a --save-every 100
    python -m seq2seq.train --checkpoint-dir runs/a --steps 600 --resume

A thin shell over the library: ``seq2seq.tasks`` (the data stream), ``seq2seq.recipe`` (the
recipe), ``seq2seq.trainer`` (the run, under torchrun one shard per process), ``seq2seq.checkpoint``
and ``seq2seq.evaluation``. It parses and validates options, shows a tqdm progress bar on stderr
(rank 0), writes checkpoints (rank 0), and prints the final loss and held-out accuracy on stdout
(rank 0).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from tqdm import tqdm

from common.cli import Parser, config_or_exit, device_or_exit, one_line, positive
from seq2seq import distributed, tasks
from seq2seq.checkpoint import (
    checkpoint_path,
    directory_problem,
    latest_checkpoint,
    load_checkpoint,
    save,
)
from seq2seq.distributed import World
from seq2seq.evaluation import accuracy_line, held_out_accuracy
from seq2seq.recipe import Recipe, StepReport
from seq2seq.tasks import TaskBatches, TaskData
from seq2seq.trainer import Trainer, seed_dropout
from variants import VARIANTS, build


@contextlib.contextmanager
def progress_bar(steps: int, done: int = 0) -> Iterator[Callable[[StepReport], None]]:
    """A tqdm bar on stderr for ``Trainer.run``'s ``on_step``: step, loss, learning rate and tokens/s.

    ``done``: steps a resumed run has already taken (the bar starts there).
    """
    tokens = 0
    bar_format = "[{bar:30}] step {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
    with tqdm(total=steps, initial=done, file=sys.stderr, bar_format=bar_format, ascii=".#") as bar:

        def show(report: StepReport) -> None:
            nonlocal tokens
            tokens += report.tokens
            rate = tokens / max(report.seconds, 1e-9)
            bar.set_postfix_str(f"loss {report.loss:.4f}  lr {report.lr:.2e}  {rate:,.0f} tok/s",
                                refresh=False)
            bar.update()

        yield show


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, checked by the code that owns each setting, plus ``data``, ``config`` and ``recipe``.

    A bad value is a one-line usage error (exit status 2): ``TaskData`` (through
    ``tasks.check_settings``) checks the task settings, ``TransformerConfig`` the model's and
    ``Recipe`` the optimiser's; the device must hold values, and ``--checkpoint-dir`` must take
    files (it is created here), so that no run fails at its first save.
    """
    parser = Parser(
        prog="python -m seq2seq.train",
        description="Train one variant on a synthetic task with the paper's recipe, then report "
                    "held-out exact-sequence accuracy of greedy decoding. Under torchrun, each "
                    "process trains on its share of every batch (DistributedDataParallel).",
    )
    parser.add_argument("--variant", choices=VARIANTS, default="explicit")
    parser.add_argument("--task", choices=tasks.TASKS, default="reverse")
    parser.add_argument("--steps", type=positive(int), default=300,
                        help="steps in all (a resumed run continues up to this many)")
    parser.add_argument("--batch", type=int, default=128,
                        help="sequences per step, all processes together")
    parser.add_argument("--seed", type=int, default=0, help="weights, training data and dropout")
    parser.add_argument("--warmup", type=int, default=100,
                        help="warm-up steps (the paper: 4000 for 100k steps)")
    parser.add_argument("--lr-factor", type=float, default=1.0)
    parser.add_argument("--label-smoothing", type=float, default=0.1)
    parser.add_argument("--vocab", type=int, default=13, help="vocabulary size, PAD/BOS/EOS included")
    parser.add_argument("--min-len", type=int, default=1)
    parser.add_argument("--max-len", type=int, default=10)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-ff", type=int, default=128)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--norm-first", action="store_true", help="pre-norm instead of post-norm")
    parser.add_argument("--share-embeddings", action="store_true",
                        help="one matrix for both embeddings and the generator (paper section 3.4); "
                             "the tasks' source and target share one vocabulary")
    parser.add_argument("--bf16", action="store_true",
                        help="forward pass under bfloat16 autocast (CPU or CUDA); off by default")
    parser.add_argument("--eval-size", type=positive(int), default=1000, help="held-out sequences")
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
    args = parser.parse_args(argv)
    if (args.resume or args.save_every) and args.checkpoint_dir is None:
        parser.error("--resume and --save-every need --checkpoint-dir")
    try:
        args.data = TaskData(args.task, args.batch, args.vocab, args.min_len, args.max_len, args.seed)
        args.recipe = Recipe(warmup=args.warmup, lr_factor=args.lr_factor,
                             label_smoothing=args.label_smoothing)
    except (TypeError, ValueError) as error:
        parser.error(str(error))
    args.config = config_or_exit(
        parser, d_model=args.d_model, n_heads=args.heads, n_layers=args.layers, d_ff=args.d_ff,
        dropout=args.dropout, src_vocab_size=args.vocab, tgt_vocab_size=args.vocab,
        max_seq_len=args.max_len + 2, norm_first=args.norm_first, pad_id=tasks.PAD_ID,
        share_embeddings=args.share_embeddings,
    )  # the longest target is BOS, max_len tokens, EOS
    args.device = device_or_exit(parser, args.device)
    # last, since it creates the directory: a run must not fail at its first save, hours in
    if args.checkpoint_dir is not None and (problem := directory_problem(args.checkpoint_dir)):
        parser.error(f"--checkpoint-dir {problem}")
    return args


def main(argv: list[str] | None = None) -> None:
    """Parse; join the process group (under torchrun); build or resume; train with a progress
    bar and checkpoints; evaluate held out and report (rank 0 only)."""
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    world = World.from_environment()
    device = distributed.device_for(args.device, world)
    with distributed.process_group(world, device):
        trainer = _start(args, world, device)
        start = time.perf_counter()
        losses = _train(args, trainer)
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
    if world.is_main:
        where = f"{world.size} processes on {device.type}" if world.size > 1 else str(device)
        resumed = f", resuming at step {trainer.step}" if trainer.step else ""
        print(f"{args.variant}: {args.task}, {sum(p.numel() for p in model.parameters()):,} parameters, "
              f"{args.steps} steps of {args.batch} sequences on {where}{resumed}", file=sys.stderr)
    return trainer


def _resume(args: argparse.Namespace, trainer: Trainer) -> None:
    """Restore the newest checkpoint in ``--checkpoint-dir``; one that is not this run's, or is
    already at ``--steps``, ends the program with status 1 (rank 0 says why, naming every
    difference)."""
    path = None
    try:
        path = latest_checkpoint(args.checkpoint_dir)
        trainer.restore(load_checkpoint(path), args.variant)
        if trainer.step >= args.steps:
            raise ValueError(f"it is at step {trainer.step}; ask for more --steps to continue")
    except (OSError, ValueError) as error:
        source = path or args.checkpoint_dir
        message = f"python -m seq2seq.train: error: cannot resume from {source}: {one_line(error)}"
        sys.exit(message if trainer.world.is_main else 1)


def _train(args: argparse.Namespace, trainer: Trainer) -> list[float]:
    """Run to ``--steps``; rank 0 draws the bar and writes the checkpoints (every rank helps)."""

    def save_when_due(report: StepReport) -> None:
        due = report.step == report.steps or (args.save_every and report.step % args.save_every == 0)
        if args.checkpoint_dir is not None and due:
            checkpoint = trainer.checkpoint(args.variant)  # collective: every rank calls it
            if checkpoint is not None:
                path = checkpoint_path(args.checkpoint_dir, report.step)
                try:
                    save(checkpoint, path)
                except OSError as error:  # a disk that filled up, or a directory removed, mid-run
                    sys.exit(f"python -m seq2seq.train: error: cannot write {path}: {one_line(error)}")

    if not trainer.world.is_main:
        return trainer.run(args.steps, on_step=save_when_due)
    with progress_bar(args.steps, done=trainer.step) as show_step:

        def on_step(report: StepReport) -> None:
            show_step(report)
            save_when_due(report)

        return trainer.run(args.steps, on_step=on_step)


def _report(args: argparse.Namespace, trainer: Trainer, losses: list[float], seconds: float) -> None:
    """The final loss and the held-out accuracy, on stdout."""
    accuracy = held_out_accuracy(trainer.model, args.data, args.eval_size)
    last = losses[-10:]
    print(f"final loss {sum(last) / len(last):.4f} (mean of the last {len(last)} steps), "
          f"trained in {seconds:.1f} s")
    print(accuracy_line(accuracy, args.eval_size, args.task))


if __name__ == "__main__":
    main()
