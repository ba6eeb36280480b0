"""Training on two processes (DDP over gloo on the CPU, file rendezvous) equals one process on
the whole batch; the torchrun command line; the pieces of seq2seq.training.distributed one by one.

The two-process tests start their ranks with ``torch.multiprocessing`` (spawn) under a time limit;
each child imports torch and the project afresh, about 4 s on the shared 2-core machine.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from common.random_batch import random_batch
from common.weights import export_weights
from seq2seq.data.tasks import task_batches
from seq2seq.storage.model_file import build_model, load, load_checkpoint, save
from seq2seq.training.distributed import (
    SINGLE,
    World,
    backend_for,
    device_for,
    gather_to_main,
    process_group,
    replicate,
    shard,
    sum_over_ranks,
)
from seq2seq.training.recipe import Recipe
from seq2seq.training.run import checkpoint_path, list_checkpoints
from seq2seq.training.trainer import Trainer, seed_dropout, train_steps
from tests.helpers import small_config
from variants import VARIANTS, build

ROOT = Path(__file__).resolve().parents[3]
# A large rate from the start, so five steps move the weights far. Adam's eps is 1e-6, not the
# paper's 1e-9: the key projections' biases have an exact gradient of zero (softmax ignores a
# constant added to a row of scores), so theirs is rounding noise (~1e-17), and Adam divides it
# by about eps, taking noise steps of ~lr * 1e-8 that differ between any two summation orders;
# eps 1e-6 keeps those below 1e-11, while real gradients (far above 1e-6) take full steps.
RECIPE = Recipe(warmup=5, eps=1e-6)
STEPS = 5


def _batches():
    """7 sequences: rank 0 takes 4 rows and rank 1 takes 3, of lengths 1-9, so the two shards
    hold different numbers of real tokens (the test checks it)."""
    return task_batches("reverse", 7, vocab_size=19, min_len=1, max_len=9, seed=3)


# --- running a group of processes ------------------------------------------------------------


def _in_group(rank: int, size: int, rendezvous: str, job) -> None:
    """One rank: join the group through the rendezvous file, do the job, leave."""
    torch.set_num_threads(1)
    world = World(rank=rank, size=size, local_rank=rank)
    with process_group(world, torch.device("cpu"), init_method=f"file://{rendezvous}"):
        job(world)


def run_group(job, tmp_path: Path, size: int = 2, timeout: float = 120.0) -> None:
    """``job(world)`` on ``size`` spawned processes; fails the test if one raises or time runs out."""
    rendezvous = Path(tempfile.mkdtemp(dir=tmp_path)) / "rendezvous"  # a new file for each group
    context = mp.start_processes(_in_group, args=(size, str(rendezvous), job), nprocs=size,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1.0):  # raises ProcessRaisedException if a rank failed
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{size} processes did not finish within {timeout} s")


def _train_variants(world: World, names: tuple[str, ...], out_dir: Path) -> None:
    for name in names:
        model = build(name, small_config(dropout=0.0), seed=0).double()
        rows = []  # the sources each forward pass sees: this rank's shard, not the whole batch
        model.register_forward_pre_hook(lambda module, args, rows=rows: rows.append(len(args[0])))
        losses = train_steps(model, _batches(), STEPS, RECIPE, world=world)
        torch.save({"weights": export_weights(model), "losses": losses, "rows": rows},
                   out_dir / f"{name}-{world.rank}.pt")


def check_ddp_equals_one_process(names: tuple[str, ...], tmp_path: Path) -> None:
    run_group(functools.partial(_train_variants, names=names, out_dir=tmp_path), tmp_path)
    for name in names:
        start = build(name, small_config(dropout=0.0), seed=0).double()
        initial = export_weights(start)
        losses = train_steps(start, _batches(), STEPS, RECIPE)  # one process, the whole batch
        single = export_weights(start)
        ranks = [torch.load(tmp_path / f"{name}-{rank}.pt", weights_only=True) for rank in (0, 1)]
        assert [ranks[0]["rows"], ranks[1]["rows"]] == [[4] * STEPS, [3] * STEPS], name
        assert ranks[0]["losses"] == pytest.approx(losses, abs=1e-10, rel=0), name
        for key, expected in single.items():
            torch.testing.assert_close(ranks[0]["weights"][key], expected, atol=1e-10, rtol=0,
                                       msg=functools.partial("{} {}: {}".format, name, key))
            assert torch.equal(ranks[0]["weights"][key], ranks[1]["weights"][key]), (name, key)
        moved = max((single[key] - initial[key]).abs().max() for key in single)
        assert moved > 0.05, "five real steps, not five looks at one function"


def test_the_shards_hold_different_token_counts():
    """What makes the DDP test below sharp: a per-rank mean loss would weigh these unequally."""
    _, tgt = next(_batches())
    counts = [int((shard(tgt, World(rank=r, size=2))[:, 1:] != 0).sum()) for r in (0, 1)]
    assert counts[0] != counts[1] and counts[0] / 4 != counts[1] / 3, counts


@pytest.mark.slow  # two gloo processes (about 7 s); rank seeding is checked in-process by default
def test_two_processes_equal_one_on_the_whole_batch(tmp_path):
    """Fast: one variant, five Adam steps, float64, dropout 0; about 5 s (two fresh processes)."""
    check_ddp_equals_one_process(("explicit",), tmp_path)


@pytest.mark.slow
def test_two_processes_equal_one_on_the_whole_batch_every_variant(tmp_path):
    """The same for every registered variant, in one group of two processes; about 8 s."""
    check_ddp_equals_one_process(VARIANTS, tmp_path)


def _resume_under_ddp(world: World, out_dir: Path, halves: bool) -> None:
    """Four steps with dropout: straight, or two, a checkpoint, a fresh trainer, two more."""
    def fresh() -> Trainer:
        model = build("explicit", small_config(dropout=0.1), seed=0).double()
        return Trainer(model, _batches(), RECIPE, world=world)

    seed_dropout(0, world)
    trainer = fresh()
    if halves:
        trainer.run(2)
        checkpoint = trainer.checkpoint("explicit")
        if checkpoint is not None:
            save(checkpoint, checkpoint_path(out_dir, 2))
        torch.distributed.barrier()  # rank 1 reads what rank 0 wrote
        torch.manual_seed(12345)  # a new process would start from another RNG state
        trainer = fresh()
        trainer.restore(load_checkpoint(checkpoint_path(out_dir, 2)), "explicit")
    trainer.run(4)
    run = "halves" if halves else "straight"
    torch.save(export_weights(trainer.model), out_dir / f"{run}-{world.rank}.pt")


@pytest.mark.slow
def test_resume_under_two_processes_is_exact(tmp_path):
    """Each rank restores its own dropout RNG stream: 2 + resume + 2 steps equal 4 straight,
    within 1e-12 in float64, on both ranks; about 9 s."""
    for halves in (False, True):
        run_group(functools.partial(_resume_under_ddp, out_dir=tmp_path, halves=halves), tmp_path)
    assert len(load_checkpoint(tmp_path / "step-00000002.pt").rng) == 2
    for rank in (0, 1):
        straight = torch.load(tmp_path / f"straight-{rank}.pt", weights_only=True)
        halves = torch.load(tmp_path / f"halves-{rank}.pt", weights_only=True)
        for key in straight:
            torch.testing.assert_close(halves[key], straight[key], atol=1e-12, rtol=0)


@pytest.mark.slow
def test_torchrun_command_line(tmp_path):
    """`torchrun --standalone --nproc-per-node 2 -m seq2seq.train` prints once, writes one
    checkpoint per due step, and ends where one process does (float32, so within 1e-5); ~15 s."""
    options = ["--variant", "fused", "--steps", "4", "--batch", "9", "--d-model", "16", "--heads", "2",
               "--layers", "1", "--d-ff", "16", "--eval-size", "8", "--save-every", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    two = subprocess.run([*torchrun, "-m", "seq2seq.train", *options,
                          "--checkpoint-dir", str(tmp_path / "two")],
                         capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    assert two.returncode == 0, two.stderr
    one = subprocess.run([sys.executable, "-m", "seq2seq.train", *options, "--threads", "1",
                          "--checkpoint-dir", str(tmp_path / "one")],
                         capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    assert one.returncode == 0, one.stderr
    assert two.stdout.count("final loss") == 1 and two.stdout.count("held-out") == 1, two.stdout
    # the header ("fused: reverse, 4 steps of 9 sequences, N parameters on 2 processes on cpu"),
    # once: only rank 0 prints
    assert two.stderr.count("4 steps of 9 sequences") == 1
    assert "parameters on 2 processes on cpu" in two.stderr
    assert [p.name for p in list_checkpoints(tmp_path / "two")] == ["step-00000002.pt", "step-00000004.pt"]
    assert not [p for p in (tmp_path / "two").iterdir() if p.name.endswith(".tmp")]
    assert len(load_checkpoint(tmp_path / "two" / "step-00000004.pt").rng) == 2
    # the same function, compared as one (in float32 the key biases' zero gradients are noise
    # that Adam's eps 1e-9 turns into full steps, which change no output)
    one, two = (build_model(load(tmp_path / run / "step-00000004.pt")).eval() for run in ("one", "two"))
    batch = random_batch(one.config, batch=4, src_len=6, tgt_len=5)
    with torch.no_grad():
        torch.testing.assert_close(two(*batch.inputs()), one(*batch.inputs()), atol=1e-4, rtol=0)


# --- the pieces, in one process ------------------------------------------------------------


def test_world_from_torchrun_environment():
    assert World.from_environment({}) == SINGLE
    world = World.from_environment({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert world == World(rank=3, size=4, local_rank=1) and not world.is_main
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        World.from_environment({"RANK": "0", "WORLD_SIZE": "two"})
    with pytest.raises(ValueError, match="rank"):
        World(rank=2, size=2)
    with pytest.raises(TypeError, match="size"):
        World(size=2.0)


def test_shards_are_the_whole_batch_in_order():
    batch = torch.arange(7 * 3).reshape(7, 3)
    for size in (1, 2, 3, 7):
        shards = [shard(batch, World(rank=r, size=size)) for r in range(size)]
        assert torch.equal(torch.cat(shards), batch)
        assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1
    with pytest.raises(ValueError, match="at least one"):
        shard(batch, World(rank=0, size=8))


def test_backend_and_device_are_chosen_from_the_device():
    assert backend_for(torch.device("cpu")) == "gloo"
    assert backend_for(torch.device("cuda", 0)) == "nccl"
    assert device_for(torch.device("cuda"), World(rank=3, size=4, local_rank=1)) == torch.device("cuda", 1)
    assert device_for(torch.device("cuda"), SINGLE) == torch.device("cuda")
    assert device_for(torch.device("cpu"), World(rank=1, size=2, local_rank=1)) == torch.device("cpu")


def test_one_process_needs_no_group():
    model = build("explicit", small_config(), seed=0)
    tensor = torch.ones(3)
    assert replicate(model, SINGLE) is model
    assert sum_over_ranks(tensor, SINGLE) is tensor
    assert gather_to_main("state", SINGLE) == ["state"]
    with process_group(SINGLE, torch.device("cpu")):
        assert not torch.distributed.is_initialized()
