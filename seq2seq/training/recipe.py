"""The paper's training recipe (sections 5.3-5.4): its settings (``Recipe``), the learning-rate
schedule, Adam, the label-smoothed loss, one optimiser step (``train_step``), and the report a
step hands its callback (``StepReport``).

    optimizer, scheduler = make_optimizer(model, Recipe(warmup=100))
    loss = train_step(model, optimizer, scheduler, src, tgt, label_smoothing=0.1)

Recipe: Adam(beta1=0.9, beta2=0.98, eps=1e-9); learning rate
``factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`` (linear warm-up, then inverse
square root); label smoothing 0.1; teacher forcing: the decoder reads ``tgt[:, :-1]`` and
predicts ``tgt[:, 1:]``, padding excluded from the loss. Works with any model from
``variants.build`` (or its DDP wrapper, ``seq2seq.training.distributed``) and prints nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from common.checks import check_int, check_number
from common.masks import decoder_mask, padding_mask
from seq2seq.training import distributed
from seq2seq.training.distributed import SINGLE, World


@dataclass(frozen=True)
class Recipe:
    """Optimiser, schedule and loss settings; the defaults are the paper's except ``warmup``."""

    warmup: int = 4000  # steps of linear warm-up; the paper's 4000 suits ~100k-step runs
    lr_factor: float = 1.0  # scales the whole schedule
    label_smoothing: float = 0.1  # epsilon_ls
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9

    def __post_init__(self) -> None:
        check_int("Recipe.warmup", self.warmup, low=1)
        check_number("Recipe.lr_factor", self.lr_factor)  # an infinite rate trains to NaN weights
        check_number("Recipe.label_smoothing", self.label_smoothing, high=1.0, low_closed=True)


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


def smoothed_loss_sum(
    log_probs: Tensor, target: Tensor, pad_id: int, smoothing: float
) -> tuple[Tensor, Tensor]:
    """The cross-entropy against the smoothed target, summed over non-pad positions, and their
    count (a 0-d int tensor); the loss is ``sum / count``.

    The smoothed target puts 1 - smoothing on the true token and spreads ``smoothing``
    uniformly over the whole vocabulary (as ``F.cross_entropy(label_smoothing=)`` does), so each
    position's loss is (1 - smoothing) * NLL + smoothing * mean over the vocabulary of -log p.
    log_probs (B, T, V) from ``model.project``; target (B, T) ids. A sum and a count add up over
    the shards of a batch; means do not, unless every shard has as many real tokens.
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
    """What ``Trainer.run`` (and so ``train``) tells its callback after each step."""

    step: int  # counts from 1
    steps: int
    loss: float
    lr: float  # the rate this step used
    tokens: int  # real (non-pad) source and target tokens in this step's batch
    seconds: float  # since training began
