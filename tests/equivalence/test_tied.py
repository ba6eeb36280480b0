"""Tied models (shared embeddings, paper section 3.4) compute the reference's function, take the
same gradient for the one matrix (the sum of its three uses) and train in lockstep with it; the
three uses stay one tensor through training and ``.to()``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from common.batches import Batch, random_batch
from common.weights import TIED, export_gradients, export_weights, import_weights
from tests.core.test_tied_weights import TIED_CONFIG, USES
from tests.helpers import FLOAT64_TOL, REFERENCE, random_canonical
from variants import build

# what these tests run, by norm_first: tied, dropout 0
TIED_CONFIGS = {norm_first: TIED_CONFIG.replace(norm_first=norm_first, dropout=0.0)
                for norm_first in (False, True)}
NORMS = pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])


def tied_pair(name: str, norm_first: bool, seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The reference and variant ``name``, tied, float64, dropout 0, holding the same weights."""
    config = TIED_CONFIGS[norm_first]
    state = random_canonical(config, seed)
    models = []
    for model_name in (REFERENCE, name):
        model = build(model_name, config)
        import_weights(model, state)
        models.append(model.double())
    return models[0], models[1]


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
def test_tied_gradients_match_reference_and_sum_the_three_uses(subject_variant, norm_first):
    reference, model = tied_pair(subject_variant, norm_first)
    batch = random_batch(TIED_CONFIG, 3, 7, 5)
    grads = []
    for m in (reference, model):
        loss_of(m.train(), batch).backward()
        grads.append(export_gradients(m))
    expected, actual = grads
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], **FLOAT64_TOL, msg=name)
    # the one matrix's gradient is the sum of the gradients its three uses get when untied
    untied = build(subject_variant, model.config.replace(share_embeddings=False))
    import_weights(untied, export_weights(model))  # three equal matrices: a valid untied state
    loss_of(untied.double().train(), batch).backward()
    per_use = export_gradients(untied)
    assert all(per_use[name].abs().sum() > 0 for name in TIED)
    torch.testing.assert_close(actual[TIED[0]], sum(per_use[name] for name in TIED), **FLOAT64_TOL)


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
    torch.testing.assert_close(losses[1], losses[0], atol=1e-8, rtol=0.0)
    after, expected = export_weights(model), export_weights(reference)
    for name in expected:
        torch.testing.assert_close(after[name], expected[name], atol=1e-8, rtol=0.0, msg=name)
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
