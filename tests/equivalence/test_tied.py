"""Tied models (shared embeddings, paper section 3.4) compute the reference's function in
float64, give the one matrix the sum of its three uses' gradients and train in lockstep with the
reference; the three uses stay one tensor through training and ``.to()``. (test_equivalence's
tied layouts compare every gradient with the reference's.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from common.random_batch import Batch, random_batch
from common.weights import TIED, export_gradients, export_weights, import_weights
from tests.common.test_tied_weights import TIED_CONFIG, USES
from tests.helpers import FLOAT64_TOL, LOSSES_TOL, random_canonical
from variants import REFERENCE, build

# what these tests run, by norm_first: tied, dropout 0
TIED_CONFIGS = {norm_first: TIED_CONFIG.replace(norm_first=norm_first, dropout=0.0)
                for norm_first in (False, True)}
NORMS = pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])


def tied_model(name: str, norm_first: bool, seed: int = 0) -> torch.nn.Module:
    """Variant ``name``, tied, float64, dropout 0, holding ``random_canonical``'s weights."""
    config = TIED_CONFIGS[norm_first]
    model = build(name, config)
    import_weights(model, random_canonical(config, seed))
    return model.double()


def tied_pair(name: str, norm_first: bool, seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The reference and variant ``name``, as ``tied_model`` builds them: the same weights."""
    return tied_model(REFERENCE, norm_first, seed), tied_model(name, norm_first, seed)


def loss_of(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Next-token NLL of the batch's labels over its real target positions."""
    log_probs = model(*batch.inputs())
    return F.nll_loss(log_probs.flatten(0, 1), batch.labels.flatten(), ignore_index=model.config.pad_id)


def uses(model: torch.nn.Module, name: str) -> list[torch.Tensor]:
    """The tensors the forward reads as source embedding, target embedding, generator weight."""
    return [model.get_parameter(path) for path in USES[name]]


def assert_one_tensor(model: torch.nn.Module, name: str) -> None:
    first, *others = uses(model, name)
    assert all(other is first and other.data_ptr() == first.data_ptr() for other in others)


@NORMS
def test_tied_log_probs_match_reference(subject_variant, norm_first):
    reference, model = tied_pair(subject_variant, norm_first)
    inputs = random_batch(TIED_CONFIG, 3, 7, 5).inputs()
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(*inputs), reference.eval()(*inputs), **FLOAT64_TOL)


@NORMS
def test_the_shared_gradient_is_the_sum_of_its_three_uses(variant, norm_first):
    """The one matrix's gradient equals the sum of the three gradients an untied model holding
    three copies of it gives its source embedding, target embedding and generator weight."""
    model = tied_model(variant, norm_first)
    untied = build(variant, model.config.replace(share_embeddings=False))
    import_weights(untied, export_weights(model))  # three equal matrices: a valid untied state
    batch = random_batch(TIED_CONFIG, 3, 7, 5)
    for m in (model, untied.double()):
        loss_of(m.train(), batch).backward()
    shared, per_use = export_gradients(model)[TIED[0]], export_gradients(untied)
    assert all(per_use[name].abs().sum() > 0 for name in TIED)
    torch.testing.assert_close(shared, sum(per_use[name] for name in TIED), **FLOAT64_TOL)


@NORMS
def test_twenty_adam_steps_in_lockstep_with_reference(subject_variant, norm_first):
    reference, model = tied_pair(subject_variant, norm_first, seed=1)
    start = export_weights(model)[TIED[0]]
    losses = []
    for m in (reference, model):
        m.train()
        optimizer = torch.optim.Adam(m.parameters(), lr=3e-3)
        steps = []
        for step in range(20):
            optimizer.zero_grad()
            loss = loss_of(m, random_batch(TIED_CONFIG, 4, 7, 6, seed=step))
            loss.backward()
            optimizer.step()
            steps.append(loss.item())
        losses.append(torch.tensor(steps, dtype=torch.float64))
    torch.testing.assert_close(losses[1], losses[0], **LOSSES_TOL)
    after, expected = export_weights(model), export_weights(reference)
    for name in expected:
        torch.testing.assert_close(after[name], expected[name], **LOSSES_TOL, msg=name)
    assert (after[TIED[0]] - start).abs().max() > 0.03  # the matrix moved: real steps
    assert_one_tensor(model, subject_variant)  # still one tensor after the optimiser's steps
    assert all(torch.equal(after[name], after[TIED[0]]) for name in TIED)


MOVES = [  # (what .to() is given, the dtype and device type the matrix has after it)
    pytest.param((torch.float64,), torch.float64, "cpu", id="float64"),
    pytest.param((torch.bfloat16,), torch.bfloat16, "cpu", id="bfloat16"),
    pytest.param(("cpu", torch.float16), torch.float16, "cpu", id="cpu-float16"),
    pytest.param(("cuda",), torch.float32, "cuda", id="cuda", marks=pytest.mark.gpu),
    pytest.param(("cuda", torch.float64), torch.float64, "cuda", id="cuda-float64", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize(("to", "dtype", "device"), MOVES)
def test_the_three_uses_stay_one_tensor_through_to(variant, to, dtype, device):
    model = build(variant, TIED_CONFIG, seed=0).to(*to)
    matrix = model.get_parameter(USES[variant][0])
    assert (matrix.dtype, matrix.device.type) == (dtype, device)  # it moved
    assert_one_tensor(model, variant)
    assert_one_tensor(model.to("cpu", torch.float32), variant)  # and back
