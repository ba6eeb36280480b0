"""The paper's training recipe (section 5.3-5.4) for any variant, and a command line to run it.

    python -m seq2seq.train --variant explicit --task reverse --steps 300

Recipe: Adam(beta1=0.9, beta2=0.98, eps=1e-9); learning rate
``factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`` (linear warm-up, then inverse
square root); label smoothing 0.1; teacher forcing: the decoder reads ``tgt[:, :-1]`` and
predicts ``tgt[:, 1:]``, padding excluded from the loss.

The library part (``make_optimizer``, ``smoothed_loss``, ``train_step``, ``train``,
``task_batches``, ``held_out_batch``, ``exact_match_accuracy``) works with any model from
``variants.build`` and prints nothing; the command line below it parses and validates options,
shows a tqdm progress bar on stderr, and prints the final loss and held-out accuracy on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from tqdm import tqdm

from common.cli import Parser, config_or_exit, positive
from common.masks import decoder_mask, padding_mask
from seq2seq import tasks
from seq2seq.decoding import greedy_decode
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
    nll = -log_probs.gather(-1, target[..., None]).squeeze(-1)  # (B, T)
    uniform = -log_probs.mean(dim=-1)  # (B, T)
    per_token = (1.0 - smoothing) * nll + smoothing * uniform  # (B, T)
    return per_token[target != pad_id].mean()


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    src: Tensor,
    tgt: Tensor,
    label_smoothing: float,
) -> Tensor:
    """One optimiser step of teacher forcing on (B, S) sources and (B, T) ``BOS .. EOS`` targets.

    Returns the step's loss (detached), computed before the update.
    """
    pad_id = model.config.pad_id
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]  # (B, T - 1) each: read one, predict the next
    log_probs = model(src, tgt_in, padding_mask(src, pad_id), decoder_mask(tgt_in, pad_id))
    loss = smoothed_loss(log_probs, tgt_out, pad_id, label_smoothing)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss.detach()


@dataclass(frozen=True)
class StepReport:
    """What ``train`` tells its callback after each step."""

    step: int  # counts from 1
    steps: int
    loss: float
    lr: float  # the rate this step used
    tokens: int  # real (non-pad) source and target tokens in this step's batch
    seconds: float  # since training began


def train(
    model: nn.Module,
    batches: Iterator[tuple[Tensor, Tensor]],
    steps: int,
    recipe: Recipe | None = None,
    on_step: Callable[[StepReport], None] | None = None,
) -> list[float]:
    """Train ``model`` for ``steps`` steps on (src, tgt) batches; returns the loss of each step.

    Puts the model in train mode (dropout on, if the config has any) and leaves it there.
    Batches are moved to the model's device. ``on_step`` sees a ``StepReport`` after each step.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    recipe = recipe or Recipe()
    optimizer, scheduler = make_optimizer(model, recipe)
    device = next(model.parameters()).device
    pad_id = model.config.pad_id
    model.train()
    losses = []
    start = time.perf_counter()
    for step in range(1, steps + 1):
        src, tgt = (t.to(device) for t in next(batches))
        lr = scheduler.get_last_lr()[0]
        loss = float(train_step(model, optimizer, scheduler, src, tgt, recipe.label_smoothing))
        losses.append(loss)
        if on_step is not None:
            tokens = int((src != pad_id).sum() + (tgt[:, 1:] != pad_id).sum())
            on_step(StepReport(step, steps, loss, lr, tokens, time.perf_counter() - start))
    return losses


def task_batches(
    task: str, batch_size: int, *, vocab_size: int, min_len: int, max_len: int, seed: int
) -> Iterator[tuple[Tensor, Tensor]]:
    """An endless, seeded stream of fresh ``tasks.sample_batch`` batches."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        yield tasks.sample_batch(task, batch_size, vocab_size=vocab_size, min_len=min_len,
                                 max_len=max_len, generator=generator)


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
def progress_bar(steps: int) -> Iterator[Callable[[StepReport], None]]:
    """A tqdm bar on stderr for ``train``'s ``on_step``: step, loss, learning rate and tokens/s."""
    tokens = 0
    bar_format = "[{bar:30}] step {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
    with tqdm(total=steps, file=sys.stderr, bar_format=bar_format, ascii=".#") as bar:

        def show(report: StepReport) -> None:
            nonlocal tokens
            tokens += report.tokens
            rate = tokens / max(report.seconds, 1e-9)
            bar.set_postfix_str(f"loss {report.loss:.4f}  lr {report.lr:.2e}  {rate:,.0f} tok/s",
                                refresh=False)
            bar.update()

        yield show


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, checked by the code that owns each setting, plus ``config`` and ``recipe``.

    A bad value is a one-line usage error (exit status 2): ``tasks.check_settings`` checks the
    task settings, ``TransformerConfig`` the model's and ``Recipe`` the optimiser's.
    """
    parser = Parser(
        prog="python -m seq2seq.train",
        description="Train one variant on a synthetic task with the paper's recipe, then report "
                    "held-out exact-sequence accuracy of greedy decoding.",
    )
    parser.add_argument("--variant", choices=VARIANTS, default="explicit")
    parser.add_argument("--task", choices=tasks.TASKS, default="reverse")
    parser.add_argument("--steps", type=positive(int), default=300)
    parser.add_argument("--batch", type=int, default=128, help="sequences per step")
    parser.add_argument("--seed", type=int, default=0, help="weights and training data")
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
    parser.add_argument("--eval-size", type=positive(int), default=1000, help="held-out sequences")
    parser.add_argument("--device", default="cpu", help="e.g. cpu, cuda, cuda:1")
    parser.add_argument("--threads", type=positive(int), default=None,
                        help="CPU threads for torch (default: torch's choice); 1 suits small "
                             "models on a shared machine")
    args = parser.parse_args(argv)
    try:
        tasks.check_settings(args.task, args.batch, **task_shape(args))
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
    try:
        args.device = torch.device(args.device)
    except RuntimeError as error:
        parser.error(f"--device: {error}")
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available on this machine")
    return args


def task_shape(args: argparse.Namespace) -> dict[str, int]:
    """The ``vocab_size``, ``min_len`` and ``max_len`` keywords of the task functions."""
    return dict(vocab_size=args.vocab, min_len=args.min_len, max_len=args.max_len)


def main(argv: list[str] | None = None) -> None:
    """Parse, build, train (with a progress bar), evaluate held out, report."""
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model = build(args.variant, args.config, seed=args.seed).to(args.device)
    print(f"{args.variant}: {args.task}, {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"{args.steps} steps of {args.batch} sequences on {args.device}", file=sys.stderr)

    batches = task_batches(args.task, args.batch, seed=args.seed, **task_shape(args))
    start = time.perf_counter()
    with progress_bar(args.steps) as show_step:
        losses = train(model, batches, args.steps, args.recipe, on_step=show_step)
    seconds = time.perf_counter() - start

    src, tgt = held_out_batch(args.task, args.eval_size, seed=args.seed, **task_shape(args))
    accuracy = exact_match_accuracy(model, src, tgt)

    last = losses[-10:]
    print(f"final loss {sum(last) / len(last):.4f} (mean of the last {len(last)} steps), "
          f"trained in {seconds:.1f} s")
    print(f"held-out exact-sequence accuracy: {accuracy:.1%} "
          f"({round(accuracy * args.eval_size)}/{args.eval_size} {args.task} sequences, greedy)")


if __name__ == "__main__":
    main()
