"""Training on several processes: torchrun's environment, the process group, batch shards, sums.

    torchrun --standalone --nproc-per-node 2 -m seq2seq.train --steps 300

torchrun starts one process per rank and tells each where it stands through environment
variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``).
``World.from_environment`` reads them (one process of one when they are absent),
``process_group`` joins the group (gloo on the CPU, NCCL on CUDA), ``replicate`` wraps the model
in ``DistributedDataParallel``, ``shard`` gives a rank its rows of a batch and
``sum_over_ranks`` adds a tensor over all ranks. With one process every function here is the
identity or a no-op, so the same training code runs with and without torchrun.

Data parallelism only: every rank holds the whole model and the whole optimiser state; DDP
averages the gradients over ranks during ``backward``, so the replicas stay identical.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from common.checks import check_int


@dataclass(frozen=True)
class World:
    """Where this process stands among the processes that train together."""

    rank: int = 0  # this process, in [0, size); rank 0 prints and writes files
    size: int = 1  # processes in all (torchrun: nnodes * nproc-per-node)
    local_rank: int = 0  # this process among those on its machine; picks its GPU

    def __post_init__(self) -> None:
        check_int("World.size", self.size, low=1)
        for name in ("rank", "local_rank"):
            check_int(f"World.{name}", getattr(self, name))
        if not 0 <= self.rank < self.size:
            raise ValueError(f"World.rank must lie in [0, size={self.size}), got {self.rank}")
        if not 0 <= self.local_rank < self.size:
            raise ValueError(f"World.local_rank must lie in [0, size={self.size}), got {self.local_rank}")

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that prints and writes."""
        return self.rank == 0

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> World:
        """torchrun's ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; one process when they are unset."""
        environ = os.environ if environ is None else environ
        if "WORLD_SIZE" not in environ:
            return cls()
        values = {}
        for field, variable in (("rank", "RANK"), ("size", "WORLD_SIZE"), ("local_rank", "LOCAL_RANK")):
            text = environ.get(variable, "0")
            try:
                values[field] = int(text)
            except ValueError:
                raise ValueError(f"environment variable {variable} must be an int, got {text!r}") from None
        return cls(**values)


SINGLE = World()  # one process: no group, no sharding


def backend_for(device: torch.device) -> str:
    """NCCL between GPUs, gloo between CPU processes."""
    return "nccl" if device.type == "cuda" else "gloo"


def device_for(requested: torch.device, world: World) -> torch.device:
    """The device this process trains on: ``cuda`` means this process's own GPU under torchrun.

    ``--device cuda`` with several processes gives each ``cuda:LOCAL_RANK``; an explicit index,
    or the CPU, is taken as given.
    """
    if requested.type == "cuda" and requested.index is None and world.size > 1:
        return torch.device("cuda", world.local_rank)
    return requested


@contextlib.contextmanager
def process_group(world: World, device: torch.device, init_method: str = "env://") -> Iterator[None]:
    """Join the group of ``world.size`` processes for the block, then leave it (a no-op for one).

    ``env://`` reads torchrun's ``MASTER_ADDR`` and ``MASTER_PORT``; tests pass ``file://PATH``.
    """
    if world.size == 1:
        yield
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend_for(device), init_method=init_method, rank=world.rank,
                            world_size=world.size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def replicate(model: nn.Module, world: World) -> nn.Module:
    """``model`` wrapped in DistributedDataParallel (the model itself for one process).

    DDP copies rank 0's weights and buffers to every rank here, then averages gradients over
    ranks in ``backward``.
    """
    if world.size == 1:
        return model
    device = next(model.parameters()).device
    return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DDP wrapper (or the model itself)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def shard(batch: Tensor, world: World) -> Tensor:
    """This rank's rows of ``batch``: consecutive blocks, which together are the whole batch.

    Blocks differ by at most one row when ``size`` does not divide the batch; the loss is
    weighted by token counts (``seq2seq.training.recipe.train_step``), so uneven blocks are fine.
    """
    rows = batch.shape[0]
    if rows < world.size:
        raise ValueError(f"a batch of {rows} sequences cannot give each of {world.size} processes "
                         "at least one; use a batch of at least as many sequences as processes")
    return batch.tensor_split(world.size)[world.rank]


def sum_over_ranks(tensor: Tensor, world: World) -> Tensor:
    """``tensor`` added up over all ranks (a new tensor; ``tensor`` itself for one process)."""
    if world.size == 1:
        return tensor
    total = tensor.clone()
    dist.all_reduce(total)
    return total


def gather_to_main(value: object, world: World) -> list[object] | None:
    """Every rank's ``value`` as a list on rank 0, ``None`` elsewhere; every rank must call it."""
    if world.size == 1:
        return [value]
    gathered = [None] * world.size if world.is_main else None
    dist.gather_object(value, gathered, dst=0)
    return gathered
