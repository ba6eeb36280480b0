"""The paper's training recipe (section 5.3-5.4) for any variant, and a command line to run it.

    python -m seq2seq.train --variant explicit --task reverse --steps 300
    torchrun --standalone --nproc-per-node 2 -m seq2seq.train --checkpoint-dir runs/a --save-every 100
    python -m seq2seq.train --checkpoint-dir runs/a --steps 600 --resume

Recipe: Adam(beta1=0.9, beta2=0.98, eps=1e-9); learning rate
``factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`` (linear warm-up, then inverse
square root); label smoothing 0.1; teacher forcing: the decoder reads ``tgt[:, :-1]`` and
predicts ``tgt[:, 1:]``, padding excluded from the loss.

Under torchrun each process trains on its shard of every batch and DDP averages the gradients
(``seq2seq.distributed``); the update equals one process's on the whole batch. A ``Trainer``
holds a run in progress, and its checkpoints (``seq2seq.checkpoint``) resume it exactly.

The library part (``make_optimizer``, ``smoothed_loss``, ``train_step``, ``Trainer``, ``train``,
``task_batches``, ``held_out_batch``, ``exact_match_accuracy``) works with any model from
``variants.build`` and prints nothing; the command line below it parses and validates options,
shows a tqdm progress bar on stderr (rank 0), writes checkpoints (rank 0), and prints the final
loss and held-out accuracy on stdout (rank 0).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm import tqdm

from common.cli import Parser, config_or_exit, positive
from common.masks import decoder_mask, padding_mask
from common.weights import export_weights, import_weights
from seq2seq import distributed, tasks
from seq2seq.checkpoint import (
    Checkpoint,
    capture_rng,
    check_resumable,
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    restore_rng,
    save,
)
from seq2seq.decoding import greedy_decode
from seq2seq.distributed import SINGLE, World
from variants import VARIANTS, build


@dataclass(frozen=True)
class Recipe:
    """Optimiser, schedule and loss settings; the defaults are the paper's except ``warmup``."""

    warmup: int = 4000  # steps of linear warm-up; the paper's 4000 suits ~100k-step runs
    lr_factor: float = 1.0  # scales the whole schedule
    label_smoothing: float = 0.1  # epsilon_ls
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9

    def __post_init__(self) -> None:
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 1:
            raise ValueError(f"Recipe.warmup must be a positive int, got {self.warmup!r}")
        if not self.lr_factor > 0:
            raise ValueError(f"Recipe.lr_factor must be positive, got {self.lr_factor!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"Recipe.label_smoothing must be in [0, 1), got {self.label_smoothing!r}")


def learning_rate(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """Equation (3): factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), for step >= 1."""
    if step < 1:
        raise ValueError(f"step counts from 1, got {step}")
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def make_optimizer(
    model: nn.Module, recipe: Recipe
) -> tuple[torch.optim.Adam, torch.optim.lr_scheduler.LambdaLR]:
    """Adam over every parameter, and the schedule that sets its rate (step it after Adam)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=recipe.betas, eps=recipe.eps)
    # LambdaLR multiplies the base rate 1.0 by this; it counts from 0, equation (3) from 1.
    rate = functools.partial(_rate_from_zero, d_model=model.config.d_model, warmup=recipe.warmup,
                             factor=recipe.lr_factor)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, rate)


def _rate_from_zero(step: int, *, d_model: int, warmup: int, factor: float) -> float:
    return learning_rate(step + 1, d_model, warmup, factor)


def smoothed_loss(log_probs: Tensor, target: Tensor, pad_id: int, smoothing: float) -> Tensor:
    """Mean over non-pad positions of the cross-entropy against the smoothed target.

    The smoothed target puts 1 - smoothing on the true token and spreads ``smoothing``
    uniformly over the whole vocabulary (as ``F.cross_entropy(label_smoothing=)`` does), so the
    loss is (1 - smoothing) * NLL + smoothing * mean over the vocabulary of -log p.
    log_probs (B, T, V) from ``model.project``; target (B, T) ids.
    """
    total, tokens = smoothed_loss_sum(log_probs, target, pad_id, smoothing)
    return total / tokens


def smoothed_loss_sum(
    log_probs: Tensor, target: Tensor, pad_id: int, smoothing: float
) -> tuple[Tensor, Tensor]:
    """The smoothed cross-entropy summed over non-pad positions, and their count (a 0-d int tensor).

    A sum and a count add up over the shards of a batch; means do not, unless every shard has
    as many real tokens.
    """
    nll = -log_probs.gather(-1, target[..., None]).squeeze(-1)  # (B, T)
    uniform = -log_probs.mean(dim=-1)  # (B, T)
    per_token = (1.0 - smoothing) * nll + smoothing * uniform  # (B, T)
    real = target != pad_id  # (B, T)
    return per_token[real].sum(), real.sum()


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    src: Tensor,
    tgt: Tensor,
    label_smoothing: float,
    *,
    world: World = SINGLE,
    bf16: bool = False,
) -> Tensor:
    """One optimiser step of teacher forcing on (B, S) sources and (B, T) ``BOS .. EOS`` targets.

    Returns the loss of the whole batch (detached), computed before the update.

    Several processes: ``model`` is the DDP wrapper (``distributed.replicate``), ``world`` says
    where this process stands and src/tgt are its shard of the batch. The loss each rank
    differentiates is its token sum over the whole batch's token count (added up over ranks),
    times ``world.size`` because DDP averages the gradients over ranks: the update is one
    process's on the whole batch, however unevenly the padding falls between the shards.
    ``bf16``: the forward pass under ``torch.autocast`` in bfloat16 (matrix products and
    attention in bfloat16, weights, gradients and Adam in the model's own dtype); the loss is
    summed in float32.
    """
    pad_id = distributed.unwrap(model).config.pad_id
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]  # (B, T - 1) each: read one, predict the next
    with torch.autocast(src.device.type, dtype=torch.bfloat16, enabled=bf16):
        log_probs = model(src, tgt_in, padding_mask(src, pad_id), decoder_mask(tgt_in, pad_id))
    if log_probs.dtype == torch.bfloat16:
        log_probs = log_probs.float()
    total, tokens = smoothed_loss_sum(log_probs, tgt_out, pad_id, label_smoothing)
    batch_total, batch_tokens = distributed.sum_over_ranks(
        torch.stack([total.detach(), tokens.to(total.dtype)]), world)  # one all_reduce for both
    optimizer.zero_grad(set_to_none=True)
    (total * (world.size / batch_tokens)).backward()
    optimizer.step()
    scheduler.step()
    return batch_total / batch_tokens


@dataclass(frozen=True)
class StepReport:
    """What ``train`` tells its callback after each step."""

    step: int  # counts from 1
    steps: int
    loss: float
    lr: float  # the rate this step used
    tokens: int  # real (non-pad) source and target tokens in this step's batch
    seconds: float  # since training began


# --- data ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskData:
    """The training stream's settings: each step draws ``batch_size`` fresh pairs of ``task``."""

    task: str
    batch_size: int  # sequences per step, all processes together
    vocab_size: int  # PAD, BOS and EOS included
    min_len: int  # shortest source
    max_len: int  # longest source
    seed: int  # the stream's generator

    def __post_init__(self) -> None:
        tasks.check_settings(self.task, self.batch_size, **self.shape())
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"seed must be an int, got {type(self.seed).__name__} {self.seed!r}")

    def shape(self) -> dict[str, int]:
        """The ``vocab_size``, ``min_len`` and ``max_len`` keywords of the task functions."""
        return dict(vocab_size=self.vocab_size, min_len=self.min_len, max_len=self.max_len)


class TaskBatches:
    """An endless stream of fresh ``tasks.sample_batch`` batches from one seeded generator.

    ``generator``'s state is the stream's position: a checkpoint saves it, so a resumed run
    draws the batches the uninterrupted run would have drawn.
    """

    def __init__(self, data: TaskData) -> None:
        if not isinstance(data, TaskData):
            raise TypeError(f"data must be a TaskData, got {type(data).__name__}")
        self.data = data
        self.generator = torch.Generator().manual_seed(data.seed)

    def __iter__(self) -> TaskBatches:
        return self

    def __next__(self) -> tuple[Tensor, Tensor]:
        return tasks.sample_batch(self.data.task, self.data.batch_size, generator=self.generator,
                                  **self.data.shape())


def task_batches(
    task: str, batch_size: int, *, vocab_size: int, min_len: int, max_len: int, seed: int
) -> TaskBatches:
    """An endless, seeded stream of fresh ``tasks.sample_batch`` batches."""
    return TaskBatches(TaskData(task, batch_size, vocab_size, min_len, max_len, seed))


# --- a run -----------------------------------------------------------------------------------


class Trainer:
    """A training run in progress: the model, Adam and its schedule, the batch stream, the steps
    done, and how each step is spread over processes. ``checkpoint`` captures all of it and
    ``restore`` puts it back, so a resumed run continues exactly.

    Every rank draws the same whole batch from ``batches`` and trains on its shard
    (``distributed.shard``); ``world`` is this process's place (``distributed.SINGLE`` for one).
    Under several processes the model is wrapped in DDP here, which copies rank 0's weights to
    every rank. Dropout draws from torch's global RNG: seed it per rank (``seed_dropout``).
    """

    def __init__(self, model: nn.Module, batches: Iterator[tuple[Tensor, Tensor]],
                 recipe: Recipe | None = None, *, world: World = SINGLE, bf16: bool = False) -> None:
        if not isinstance(world, World):
            raise TypeError(f"world must be a distributed.World, got {type(world).__name__}")
        if not isinstance(bf16, bool):
            raise TypeError(f"bf16 must be a bool, got {type(bf16).__name__}")
        self.model = model
        self.batches = batches
        self.recipe = recipe or Recipe()
        self.world = world
        self.bf16 = bf16
        self.device = next(model.parameters()).device
        self.optimizer, self.scheduler = make_optimizer(model, self.recipe)
        self.replica = distributed.replicate(model, world)  # what runs the steps

    @property
    def step(self) -> int:
        """Optimiser steps done."""
        return self.scheduler.last_epoch

    def run(self, steps: int, on_step: Callable[[StepReport], None] | None = None) -> list[float]:
        """Train until ``steps`` steps are done in all; returns the loss of each step taken.

        Puts the model in train mode (dropout on, if the config has any) and leaves it there.
        ``on_step`` sees a ``StepReport`` after each step, on every rank (losses and token
        counts are the whole batch's, the same on every rank).
        """
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive int, got {steps!r}")
        if steps < self.step:
            raise ValueError(f"steps ({steps}) is below the {self.step} steps already done")
        pad_id = self.model.config.pad_id
        self.replica.train()
        losses = []
        start = time.perf_counter()
        while self.step < steps:
            src, tgt = next(self.batches)  # the whole batch, the same on every rank
            tokens = int((src != pad_id).sum() + (tgt[:, 1:] != pad_id).sum())
            src, tgt = (distributed.shard(t, self.world).to(self.device) for t in (src, tgt))
            lr = self.scheduler.get_last_lr()[0]
            loss = float(train_step(self.replica, self.optimizer, self.scheduler, src, tgt,
                                    self.recipe.label_smoothing, world=self.world, bf16=self.bf16))
            losses.append(loss)
            if on_step is not None:
                on_step(StepReport(self.step, steps, loss, lr, tokens, time.perf_counter() - start))
        return losses

    def settings(self) -> dict[str, object]:
        """What a resumed run must share with this one besides the variant and config."""
        if not isinstance(self.batches, TaskBatches):
            raise TypeError("checkpoints need a TaskBatches stream (its position is saved), "
                            f"got {type(self.batches).__name__}")
        return {"data": dataclasses.asdict(self.batches.data),
                "recipe": dataclasses.asdict(self.recipe), "bf16": self.bf16}

    def checkpoint(self, variant: str) -> Checkpoint | None:
        """This run's state, named as ``variant``'s, on rank 0; ``None`` on other ranks.

        Every rank must call it: it gathers each rank's RNG state to rank 0.
        """
        settings = self.settings()
        rng = distributed.gather_to_main(capture_rng(self.device), self.world)
        if not self.world.is_main:
            return None
        return Checkpoint(
            variant=variant, config=self.model.config, settings=settings,
            weights=export_weights(self.model), step=self.step,
            optimizer=copy.deepcopy(self.optimizer.state_dict()),
            scheduler=copy.deepcopy(self.scheduler.state_dict()),
            rng=tuple(rng), data_rng=self.batches.generator.get_state(),
        )

    def restore(self, checkpoint: Checkpoint, variant: str) -> None:
        """Continue from ``checkpoint``: weights, Adam, schedule, batch stream and this rank's RNG.

        Refused with a ``ValueError`` naming every difference, before anything changes, unless
        it was written by a run of ``variant`` with this config and these settings on as many
        processes.
        """
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"checkpoint must be a Checkpoint, got {type(checkpoint).__name__}")
        check_resumable(checkpoint, variant=variant, config=self.model.config,
                        settings=self.settings(), processes=self.world.size)
        import_weights(self.model, checkpoint.weights, config=checkpoint.config)
        self.optimizer.load_state_dict(checkpoint.optimizer)
        self.scheduler.load_state_dict(checkpoint.scheduler)
        self.batches.generator.set_state(checkpoint.data_rng)
        restore_rng(checkpoint.rng[self.world.rank], self.device)


def train(
    model: nn.Module,
    batches: Iterator[tuple[Tensor, Tensor]],
    steps: int,
    recipe: Recipe | None = None,
    on_step: Callable[[StepReport], None] | None = None,
    *,
    world: World = SINGLE,
    bf16: bool = False,
) -> list[float]:
    """Train ``model`` for ``steps`` steps on (src, tgt) batches; returns the loss of each step.

    A fresh ``Trainer``'s ``run``: puts the model in train mode and leaves it there; batches
    are moved to the model's device; ``on_step`` sees a ``StepReport`` after each step.
    """
    return Trainer(model, batches, recipe, world=world, bf16=bf16).run(steps, on_step)


DROPOUT_SEED_OFFSET = 2**30


def seed_dropout(seed: int, world: World = SINGLE) -> None:
    """Seed torch's global RNG (dropout) with ``seed + 2**30 + rank``: each rank its own stream,
    none of them the batch stream's (seed) or the held-out set's (seed + 2**31)."""
    torch.manual_seed(seed + DROPOUT_SEED_OFFSET + world.rank)


HELD_OUT_SEED_OFFSET = 2**31


def held_out_batch(
    task: str, size: int, *, vocab_size: int, min_len: int, max_len: int, seed: int
) -> tuple[Tensor, Tensor]:
    """``size`` (src, tgt) pairs from a generator other than the training stream's of ``seed``.

    Its seed is ``seed + 2**31``: torch's CPU generator keeps only a seed's low 32 bits (so
    ``2**62 + seed`` would replay the training stream), and this offset changes them.
    """
    generator = torch.Generator().manual_seed(seed + HELD_OUT_SEED_OFFSET)
    return tasks.sample_batch(task, size, vocab_size=vocab_size, min_len=min_len, max_len=max_len,
                              generator=generator)


def held_out_accuracy(model: nn.Module, data: TaskData, size: int) -> float:
    """``exact_match_accuracy`` on ``size`` held-out pairs of the task ``data`` trains on."""
    src, tgt = held_out_batch(data.task, size, seed=data.seed, **data.shape())
    return exact_match_accuracy(model, src, tgt)


def exact_match_accuracy(model: nn.Module, src: Tensor, tgt: Tensor, batch_size: int = 256) -> float:
    """Share of rows whose greedy decoding equals the target exactly (BOS .. EOS, then padding).

    Decodes in eval mode (no dropout); the model's mode is restored afterwards.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    pad_id, max_len = model.config.pad_id, tgt.shape[1]
    correct = 0
    for first in range(0, src.shape[0], batch_size):
        src_part = src[first:first + batch_size].to(device)
        tgt_part = tgt[first:first + batch_size].to(device)
        decoded = greedy_decode(model, src_part, padding_mask(src_part, pad_id), max_len=max_len,
                                bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)  # (B, L), L <= max_len
        # decoding stops early once every row has ended; the rest is padding
        decoded = nn.functional.pad(decoded, (0, max_len - decoded.shape[1]), value=pad_id)
        correct += int((decoded == tgt_part).all(dim=1).sum())
    model.train(was_training)
    return correct / src.shape[0]


# --- command line --------------------------------------------------------------------------


@contextlib.contextmanager
def progress_bar(steps: int, done: int = 0) -> Iterator[Callable[[StepReport], None]]:
    """A tqdm bar on stderr for ``train``'s ``on_step``: step, loss, learning rate and tokens/s.

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
    ``Recipe`` the optimiser's.
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
    return args


def device_or_exit(parser: argparse.ArgumentParser, name: str) -> torch.device:
    """``torch.device(name)``, usable on this machine; anything else is a usage error."""
    try:
        device = torch.device(name)
    except RuntimeError as error:
        parser.error(f"--device: {error}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available on this machine")
    return device


def accuracy_line(accuracy: float, size: int, task: str) -> str:
    """The held-out report both command lines print."""
    return (f"held-out exact-sequence accuracy: {accuracy:.1%} "
            f"({round(accuracy * size)}/{size} {task} sequences, greedy)")


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
        path = None
        try:
            path = latest_checkpoint(args.checkpoint_dir)
            trainer.restore(load_checkpoint(path), args.variant)
            if trainer.step >= args.steps:
                raise ValueError(f"it is at step {trainer.step}; ask for more --steps to continue")
        except ValueError as error:
            source = path or args.checkpoint_dir
            message = f"python -m seq2seq.train: error: cannot resume from {source}: {error}"
            sys.exit(message if world.is_main else 1)  # status 1; only rank 0 says why
    if world.is_main:
        where = f"{world.size} processes on {device.type}" if world.size > 1 else str(device)
        resumed = f", resuming at step {trainer.step}" if trainer.step else ""
        print(f"{args.variant}: {args.task}, {sum(p.numel() for p in model.parameters()):,} parameters, "
              f"{args.steps} steps of {args.batch} sequences on {where}{resumed}", file=sys.stderr)
    return trainer


def _train(args: argparse.Namespace, trainer: Trainer) -> list[float]:
    """Run to ``--steps``; rank 0 draws the bar and writes the checkpoints (every rank helps)."""

    def save_when_due(report: StepReport) -> None:
        due = report.step == report.steps or (args.save_every and report.step % args.save_every == 0)
        if args.checkpoint_dir is not None and due:
            checkpoint = trainer.checkpoint(args.variant)  # collective: every rank calls it
            if checkpoint is not None:
                save(checkpoint, checkpoint_path(args.checkpoint_dir, report.step))

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
