"""Synthetic sequence-to-sequence tasks (copy and reverse random token sequences) and the
training stream that draws them (``TaskData``, ``TaskBatches``, ``task_batches``).

    generator = torch.Generator().manual_seed(0)
    src, tgt = sample_batch("reverse", 32, vocab_size=13, min_len=1, max_len=10,
                            generator=generator)
    # src (32, 10): x1 .. xn PAD ..          n uniform in [min_len, max_len]
    # tgt (32, 12): BOS xn .. x1 EOS PAD ..  (copy: BOS x1 .. xn EOS PAD ..)
    batches = TaskBatches(TaskData("reverse", 32, vocab_size=13, min_len=1, max_len=10, seed=0))
    src, tgt = next(batches)                 # a fresh batch each time, the same ones per seed

Ids 0, 1, 2 are reserved for PAD, BOS and EOS (PAD is ``TransformerConfig.pad_id``'s default);
content tokens are drawn uniformly from [3, vocab_size). The same generator state gives the
same batch, so a seed fixes a whole stream of batches.

Shape legend:
    B  batch    N  longest source (max_len)    N + 2  target with BOS and EOS
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from common.checks import check_int
from seq2seq.data.ids import BOS_ID, EOS_ID, PAD_ID

FIRST_TOKEN_ID = EOS_ID + 1  # the smallest content token

TASKS: tuple[str, ...] = ("copy", "reverse")


def sample_batch(
    task: str,
    batch_size: int,
    *,
    vocab_size: int,
    min_len: int,
    max_len: int,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """(B, N) padded sources and their (B, N + 2) targets ``BOS answer EOS PAD..``, on the CPU."""
    check_settings(task, batch_size, vocab_size=vocab_size, min_len=min_len, max_len=max_len)
    lengths = torch.randint(min_len, max_len + 1, (batch_size,), generator=generator)  # (B,)
    tokens = torch.randint(FIRST_TOKEN_ID, vocab_size, (batch_size, max_len), generator=generator)
    positions = torch.arange(max_len)  # (N,)
    is_token = positions < lengths[:, None]  # (B, N)
    src = tokens.masked_fill(~is_token, PAD_ID)  # (B, N)
    if task == "copy":
        answer = src
    else:
        # position j of the answer reads position n - 1 - j of the source; padding stays put
        source_index = (lengths[:, None] - 1 - positions).clamp(min=0)  # (B, N)
        answer = src.gather(1, source_index).masked_fill(~is_token, PAD_ID)  # (B, N)
    tgt = torch.full((batch_size, max_len + 2), PAD_ID, dtype=torch.long)  # (B, N + 2)
    tgt[:, 0] = BOS_ID
    tgt[:, 1:-1] = answer
    tgt[torch.arange(batch_size), lengths + 1] = EOS_ID
    return src, tgt


def check_settings(task: object, batch_size: object, *, vocab_size: object, min_len: object,
                   max_len: object) -> None:
    """Raise ``ValueError`` (``TypeError`` for a non-int) naming the first bad ``sample_batch`` setting."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(TASKS)}")
    for name, value in (("batch_size", batch_size), ("vocab_size", vocab_size),
                        ("min_len", min_len), ("max_len", max_len)):
        check_int(name, value, low=1)
    if vocab_size <= FIRST_TOKEN_ID:
        raise ValueError(
            f"vocab_size must exceed {FIRST_TOKEN_ID} (ids 0, 1, 2 are PAD, BOS, EOS), got {vocab_size}"
        )
    if min_len > max_len:
        raise ValueError(f"min_len ({min_len}) must not exceed max_len ({max_len})")


# --- the training stream -----------------------------------------------------------------


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
        check_settings(self.task, self.batch_size, **self.shape())
        check_int("seed", self.seed)

    def shape(self) -> dict[str, int]:
        """The ``vocab_size``, ``min_len`` and ``max_len`` keywords of the task functions."""
        return dict(vocab_size=self.vocab_size, min_len=self.min_len, max_len=self.max_len)


class TaskBatches:
    """An endless stream of fresh ``sample_batch`` batches from one seeded generator.

    ``generator``'s state is the stream's position: a checkpoint saves it, so a resumed run
    draws the batches the uninterrupted run would have drawn.
    """

    def __init__(self, data: TaskData) -> None:
        self.data = data
        self.generator = torch.Generator().manual_seed(data.seed)

    def __iter__(self) -> TaskBatches:
        return self

    def __next__(self) -> tuple[Tensor, Tensor]:
        return sample_batch(self.data.task, self.data.batch_size, generator=self.generator,
                            **self.data.shape())


def task_batches(
    task: str, batch_size: int, *, vocab_size: int, min_len: int, max_len: int, seed: int
) -> TaskBatches:
    """An endless, seeded stream of fresh ``sample_batch`` batches: ``TaskBatches`` of these settings."""
    return TaskBatches(TaskData(task, batch_size, vocab_size, min_len, max_len, seed))
