"""Dropout under data parallelism: each rank seeds torch's global RNG with seed + 2**30 + rank
(``seed_dropout``), so two ranks draw different masks, while rank 0 of any group draws what one
process does. Were every rank seeded alike, each would drop the same units of its shard and the
batch would train like one small batch repeated: the equivalence tests, run with dropout 0, could
not tell."""

from __future__ import annotations

import functools

import pytest
import torch

from common.random_batch import random_batch
from seq2seq.training.distributed import SINGLE, World, replicate
from seq2seq.training.trainer import seed_dropout
from tests.helpers import small_config
from tests.seq2seq.training.test_distributed import run_group
from variants import build

CONFIG = small_config(d_model=16, n_heads=2, n_layers=1, d_ff=16, dropout=0.5)


@pytest.fixture(autouse=True)
def global_rng_restored():
    """These tests reseed torch's global RNG; the tests after them get it back as it was."""
    state = torch.get_rng_state()
    yield
    torch.set_rng_state(state)


def output(model: torch.nn.Module, train: bool = True) -> torch.Tensor:
    """One forward of a fixed batch, (B, T, V) log-probs: in train mode under this RNG's dropout."""
    batch = random_batch(CONFIG, batch=2, src_len=5, tgt_len=4, seed=0)
    with torch.no_grad():
        return model.train(train)(*batch.inputs())


def output_after_seeding(world: World, seed: int = 0) -> torch.Tensor:
    model = build("explicit", CONFIG, seed=0).double()
    seed_dropout(seed, world)
    return output(model)


@pytest.mark.parametrize("seed, rank, size", [(0, 0, 1), (0, 1, 2), (7, 3, 4)])
def test_the_seed_is_seed_plus_2_to_the_30_plus_rank(seed, rank, size):
    seed_dropout(seed, World(rank=rank, size=size, local_rank=rank))
    assert torch.initial_seed() == seed + 2**30 + rank


def test_two_ranks_draw_different_masks_and_rank_0_draws_one_process_masks():
    ranks = [output_after_seeding(World(rank=rank, size=2, local_rank=rank)) for rank in (0, 1)]
    assert not torch.equal(ranks[0], ranks[1])
    assert torch.equal(ranks[0], output_after_seeding(SINGLE))  # one process is rank 0 of one
    assert torch.equal(ranks[1], output_after_seeding(World(rank=1, size=2, local_rank=1)))  # reproducible
    # without dropout the ranks agree exactly: only the masks differ
    model = build("explicit", CONFIG, seed=0).double()
    outputs = []
    for rank in (0, 1):
        seed_dropout(0, World(rank=rank, size=2, local_rank=rank))
        outputs.append(output(model, train=False))
    assert torch.equal(outputs[0], outputs[1])


def _forward_in_group(world: World, out_dir) -> None:
    model = build("explicit", CONFIG, seed=0).double()
    seed_dropout(0, world)
    torch.save(output(replicate(model, world)), out_dir / f"rank-{world.rank}.pt")


@pytest.mark.slow
def test_under_ddp_each_rank_draws_the_masks_its_seed_gives(tmp_path):
    """Two processes (gloo, spawned), the same batch on both through DDP: different outputs, each
    the one a single process draws after seeding as that rank; two fresh processes, 18 s
    measured on a busy 2-core machine."""
    run_group(functools.partial(_forward_in_group, out_dir=tmp_path), tmp_path)
    outputs = [torch.load(tmp_path / f"rank-{rank}.pt", weights_only=True) for rank in (0, 1)]
    assert not torch.equal(outputs[0], outputs[1])
    for rank in (0, 1):
        assert torch.equal(outputs[rank], output_after_seeding(World(rank=rank, size=2, local_rank=rank)))
