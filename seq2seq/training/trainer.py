"""A training run: ``Trainer`` holds one in progress (model, Adam and its schedule, the batch
stream, the steps done) and checkpoints and restores it exactly; ``train`` runs a fresh one;
``seed_dropout`` gives each process its own dropout stream.

    data = TaskData("copy", 64, vocab_size=10, min_len=1, max_len=8, seed=0)
    trainer = Trainer(model, TaskBatches(data), Recipe(warmup=100))
    losses = trainer.run(800)                 # one loss per step; the model is left in train mode
    save(trainer.checkpoint("explicit"), checkpoint_path("runs/a", trainer.step))

Under torchrun each process trains on its shard of every batch and DDP averages the gradients
(``seq2seq.training.distributed``); the update equals one process's on the whole batch. Checkpoints
(``seq2seq.storage.model_file``) resume a run exactly. Prints nothing: ``python -m seq2seq.train`` is
the command line over this.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Mapping

import torch
from torch import Tensor, nn

from common.checks import check_int
from common.config import TransformerConfig
from common.weights import apply_import, export_weights, prepare_import
from seq2seq.storage.model_file import Checkpoint
from seq2seq.training import distributed
from seq2seq.training.distributed import SINGLE, World
from seq2seq.training.recipe import Recipe, StepReport, make_optimizer, train_step


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
        A loss that is NaN or infinite raises ``FloatingPointError`` naming the step, before
        ``on_step`` sees it (so no checkpoint holds the weights it updated).
        ``on_step`` sees a ``StepReport`` after each step, on every rank (losses and token
        counts are the whole batch's, the same on every rank).
        """
        check_int("steps", steps, low=1)
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
            if not math.isfinite(loss):  # the update has been made with it: nothing after is worth keeping
                precision = " under bfloat16 autocast (--no-bf16 trains in float32)" if self.bf16 else ""
                raise FloatingPointError(f"step {self.step}: the loss is {loss}{precision}; training stops "
                                         "before the step is reported or saved")
            losses.append(loss)
            if on_step is not None:
                on_step(StepReport(self.step, steps, loss, lr, tokens, time.perf_counter() - start))
        return losses

    def settings(self) -> dict[str, object]:
        """What a resumed run must share with this one besides the variant and config."""
        # a seeded stream whose generator's state is its position: TaskBatches, TokenBatches
        if not (dataclasses.is_dataclass(getattr(self.batches, "data", None))
                and isinstance(getattr(self.batches, "generator", None), torch.Generator)):
            raise TypeError("checkpoints need a seeded stream with settings (.data, a dataclass) "
                            "and a position (.generator), such as TaskBatches or TokenBatches; "
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

        All or nothing. Refused with a ``ValueError`` naming every difference unless it was
        written by a run of ``variant`` with this config and these settings on as many
        processes (``check_resumable``); then the parts torch's loaders would take without
        looking are checked against this run's own — Adam's moments against the parameters,
        the schedule's fields and step, the generator states' kind and size — and only then is
        anything applied. A refused checkpoint leaves the run exactly as it was: weights, Adam,
        step, RNG and batch stream.
        """
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"checkpoint must be a Checkpoint, got {type(checkpoint).__name__}")
        check_resumable(checkpoint, variant=variant, config=self.model.config,
                        settings=self.settings(), processes=self.world.size)
        weights = prepare_import(self.model, checkpoint.weights, config=checkpoint.config)
        problems = self._state_problems(checkpoint)
        if problems:
            raise ValueError("checkpoint cannot be restored:\n  " + "\n  ".join(problems))
        # every part has been checked: from here on nothing can fail half way
        apply_import(self.model, weights)
        self.optimizer.load_state_dict(checkpoint.optimizer)
        self.scheduler.load_state_dict(checkpoint.scheduler)
        self.batches.generator.set_state(checkpoint.data_rng)
        restore_rng(checkpoint.rng[self.world.rank], self.device)

    def _state_problems(self, checkpoint: Checkpoint) -> list[str]:
        """What is wrong with the checkpoint's Adam, schedule and generator states for this run,
        compared with its own (nothing is loaded, no scratch optimiser or generator is made)."""
        params = [param for group in self.optimizer.param_groups for param in group["params"]]
        groups = self.optimizer.state_dict()["param_groups"]
        problems = _adam_problems(checkpoint.optimizer, params, groups)
        problems += _schedule_state_problems(checkpoint.scheduler, self.scheduler.state_dict(),
                                             checkpoint.step)
        rng = checkpoint.rng[self.world.rank]
        rng = rng if isinstance(rng, dict) else {}
        problems += _generator_problems("rng cpu", rng.get("cpu"), torch.get_rng_state())
        if self.device.type == "cuda" and rng.get("cuda") is not None:
            problems += _generator_problems("rng cuda", rng["cuda"], torch.cuda.get_rng_state(self.device))
        problems += _generator_problems("data_rng", checkpoint.data_rng, self.batches.generator.get_state())
        return problems


def capture_rng(device: torch.device) -> dict[str, Tensor | None]:
    """This process's dropout RNG: torch's CPU generator, and on CUDA the device's generator."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return {"cpu": torch.get_rng_state(), "cuda": cuda}


def restore_rng(state: dict[str, Tensor | None], device: torch.device) -> None:
    """Put back what ``capture_rng`` took (the CUDA state only when training on CUDA again)."""
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def _generator_problems(name: str, state: object, like: Tensor) -> list[str]:
    """Why ``state`` is not a generator state of the kind ``like`` is (its dtype and size)."""
    if isinstance(state, Tensor) and state.dtype == like.dtype and state.shape == like.shape:
        return []
    got = f"{state.dtype} {tuple(state.shape)}" if isinstance(state, Tensor) else type(state).__name__
    return [f"{name}: not a generator state of this kind "
            f"(expected {like.dtype} {tuple(like.shape)}, got {got})"]


def _adam_problems(state: object, params: list[Tensor], groups: list[dict]) -> list[str]:
    """Adam's state dict against the parameters it must fit: its groups hold as many parameters
    as ``groups``, and every moment of parameter i has its shape and is finite."""
    if not isinstance(state, dict) or not isinstance(state.get("state"), dict) \
            or not isinstance(state.get("param_groups"), list):
        return ["optimizer: expected Adam's state_dict, a dict with 'state' and 'param_groups'"]
    sizes = [len(group.get("params", ())) if isinstance(group, dict) else None
             for group in state["param_groups"]]
    if sizes != [len(group["params"]) for group in groups]:
        return [f"optimizer.param_groups: {sizes} parameters per group, this run has "
                f"{[len(group['params']) for group in groups]}"]
    problems = []
    for index, entry in state["state"].items():
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(params):
            problems.append(f"optimizer.state: entry {index!r} names no parameter "
                            f"(there are {len(params)})")
            continue
        if not isinstance(entry, dict):
            problems.append(f"optimizer.state[{index}]: expected a dict, got {type(entry).__name__}")
            continue
        for key, value in entry.items():
            where, shape = f"optimizer.state[{index}][{key!r}]", tuple(params[index].shape)
            if not isinstance(value, Tensor):
                problems.append(f"{where}: expected a tensor, got {type(value).__name__}")
            elif value.ndim > 0 and tuple(value.shape) != shape:
                problems.append(f"{where}: shape {tuple(value.shape)}, its parameter has {shape}")
            elif not torch.isfinite(value).all():
                problems.append(f"{where}: holds NaN or inf")
    return problems


def _schedule_state_problems(stored: object, fresh: dict, step: int) -> list[str]:
    """The schedule's state dict against a fresh one's: the same fields, of the same types,
    lists of the same lengths, and at the checkpoint's step."""
    if not isinstance(stored, dict):
        return [f"scheduler: expected a dict, got {type(stored).__name__}"]
    problems = [f"scheduler: missing field {key}" for key in fresh if key not in stored]
    problems += [f"scheduler: unexpected field {key}" for key in stored if key not in fresh]
    for key, value in fresh.items():
        if key not in stored:
            continue
        if type(stored[key]) is not type(value):
            problems.append(f"scheduler.{key}: expected {type(value).__name__}, "
                            f"got {type(stored[key]).__name__}")
        elif isinstance(value, list) and len(stored[key]) != len(value):
            problems.append(f"scheduler.{key}: {len(stored[key])} entries, expected {len(value)}")
    if not problems and stored["lr_lambdas"] != fresh["lr_lambdas"]:
        # LambdaLR copies these into the schedule function's attributes
        problems.append(f"scheduler.lr_lambdas: {stored['lr_lambdas']!r}, expected {fresh['lr_lambdas']!r}")
    if not problems and stored["last_epoch"] != step:
        problems.append(f"scheduler.last_epoch: {stored['last_epoch']}, but the checkpoint is at step {step}")
    return problems


def train_steps(
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


def check_resumable(checkpoint: Checkpoint, *, variant: str, config: TransformerConfig,
                    settings: Mapping[str, object], processes: int) -> None:
    """Raise ``ValueError`` naming every way ``checkpoint`` is not this run's (nothing is loaded).

    Resuming needs the same variant, config and settings, and as many processes: each process
    keeps its own dropout RNG stream.
    """
    stored = {"variant": checkpoint.variant, "config": dataclasses.asdict(checkpoint.config),
              "settings": checkpoint.settings}
    problems = _differences("", stored, {"variant": variant, "config": dataclasses.asdict(config),
                                         "settings": settings})
    if len(checkpoint.rng) != processes:
        problems.append(f"processes: checkpoint written by {len(checkpoint.rng)}, this run has "
                        f"{processes} (each process keeps its own dropout RNG stream)")
    if problems:
        raise ValueError("checkpoint is not from this run:\n  " + "\n  ".join(problems))


def _differences(prefix: str, stored: Mapping[str, object], current: Mapping[str, object]) -> list[str]:
    """'prefix.key: checkpoint X, this run Y' for each key whose values differ, nested dicts by key
    (``prefix`` ends with its dot)."""
    found = []
    for key in sorted({*stored, *current}, key=str):
        mine, theirs = stored.get(key), current.get(key)
        if isinstance(mine, Mapping) and isinstance(theirs, Mapping):
            found += _differences(f"{prefix}{key}.", mine, theirs)
        elif mine != theirs:
            found.append(f"{prefix}{key}: checkpoint {mine!r}, this run {theirs!r}")
    return found
