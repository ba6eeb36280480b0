"""One training step against a teacher-forcing loss written out here, and ``train`` in train mode.

The lockstep test in test_training.py runs ``train`` on both sides; here the expected loss
shares no code with ``seq2seq.train`` or ``common.masks``: the target shift, both masks, the
paper's label smoothing and the padding rule are spelled out below.
"""

from __future__ import annotations

import copy

import pytest
import torch

from common.weights import export_gradients, export_weights
from seq2seq import tasks
from seq2seq.train import Recipe, make_optimizer, train, train_step
from tests.helpers import FLOAT64_TOL, small_config
from variants import VARIANTS, build

SMOOTHING = 0.1  # the paper's epsilon_ls


def teacher_forcing_loss(model, src, tgt, pad_id: int, smoothing: float) -> torch.Tensor:
    """Section 5.4's training loss for (B, S) sources and (B, T) ``BOS .. EOS PAD..`` targets.

    The decoder reads ``tgt`` without its last token and predicts it without its first; it
    attends to real source tokens only, and to real earlier target tokens only. Label smoothing
    as the paper cites it (Szegedy et al., 2016): the true distribution q(k) = delta(k, y) becomes
    q'(k) = (1 - eps) delta(k, y) + eps / V, uniform over all V target ids, and the loss is the
    cross-entropy -sum_k q'(k) log p(k), averaged over the positions whose target is not padding.
    """
    batch, src_len = src.shape
    decoder_in, predicted = tgt[:, :-1], tgt[:, 1:]
    steps = decoder_in.shape[1]
    src_mask = (src != pad_id).reshape(batch, 1, 1, src_len)
    causal = torch.ones(steps, steps, dtype=torch.bool).tril()  # query t sees keys 0..t
    tgt_mask = (decoder_in != pad_id).reshape(batch, 1, 1, steps) & causal
    log_probs = model(src, decoder_in, src_mask, tgt_mask)  # (B, T - 1, V)
    vocab = log_probs.shape[-1]
    target = torch.full_like(log_probs, smoothing / vocab)
    target.scatter_add_(-1, predicted[..., None],
                        torch.full(predicted[..., None].shape, 1.0 - smoothing, dtype=log_probs.dtype))
    cross_entropy = -(target * log_probs).sum(-1)  # (B, T - 1)
    real = predicted != pad_id
    return cross_entropy[real].sum() / real.sum()


def task_batch(pad_id: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A padded reverse-task batch whose padding id is ``pad_id`` (ids 0 and pad_id swapped)."""
    src, tgt = tasks.sample_batch("reverse", 6, vocab_size=19, min_len=1, max_len=7,
                                  generator=torch.Generator().manual_seed(seed))
    swap = {tasks.PAD_ID: pad_id, pad_id: tasks.PAD_ID}
    src, tgt = (ids.apply_(lambda i: swap.get(i, i)) for ids in (src, tgt))
    assert (src == pad_id).any() and (tgt[:, 1:] == pad_id).any()  # padding in both
    return src, tgt


PAD_IDS = [pytest.param(tasks.PAD_ID, id="pad-0"), pytest.param(4, id="pad-4")]


@pytest.mark.parametrize("pad_id", PAD_IDS)
def test_one_step_is_the_written_out_loss_its_gradients_and_one_adam_step(variant, pad_id):
    config = small_config(dropout=0.0, pad_id=pad_id)
    model = build(variant, config, seed=0).double()
    twin = copy.deepcopy(model)
    src, tgt = task_batch(pad_id)
    expected = teacher_forcing_loss(twin, src, tgt, pad_id, SMOOTHING)
    expected.backward()
    gradients = export_gradients(twin)
    before = export_weights(model)

    recipe = Recipe(warmup=7, lr_factor=3.0)
    optimizer, scheduler = make_optimizer(model, recipe)
    loss = train_step(model, optimizer, scheduler, src, tgt, label_smoothing=SMOOTHING)

    torch.testing.assert_close(loss, expected.detach(), **FLOAT64_TOL)
    actual = export_gradients(model)
    for name, grad in gradients.items():
        torch.testing.assert_close(actual[name], grad, **FLOAT64_TOL, msg=name)
    # Adam's first step, bias-corrected: m = g, v = g^2, so w -= lr * g / (|g| + eps); the rate
    # is equation (3) at step 1: factor * d_model^-0.5 * min(1, warmup^-1.5). The step's own
    # gradients (equal to the twin's, above) are used: where a gradient is zero but for
    # rounding (a key bias), g / (|g| + eps) magnifies the rounding
    rate = recipe.lr_factor * config.d_model**-0.5 * min(1.0, recipe.warmup**-1.5)
    after = export_weights(model)
    for name, grad in actual.items():
        step = rate * grad / (grad.abs() + recipe.eps)
        torch.testing.assert_close(after[name], before[name] - step, atol=1e-12, rtol=0.0, msg=name)


def test_train_uses_the_recipes_smoothing_and_the_configs_padding():
    """``train``'s first loss is the written-out loss with the recipe's epsilon."""
    config = small_config(dropout=0.0, pad_id=4)
    model = build(VARIANTS[0], config, seed=0).double()
    src, tgt = task_batch(config.pad_id)
    expected = teacher_forcing_loss(copy.deepcopy(model), src, tgt, config.pad_id, 0.3)
    (loss,) = train(model, iter([(src, tgt)]), steps=1, recipe=Recipe(label_smoothing=0.3))
    assert loss == pytest.approx(expected.item(), rel=1e-12)


def test_train_runs_every_step_in_train_mode(variant):
    """A model handed over in eval mode trains in train mode (dropout on): every forward and
    every step report see ``training``, and the model is left in train mode."""
    config = small_config(dropout=0.1)
    model = build(variant, config, seed=0).eval()
    forward_modes, step_modes = [], []
    model.register_forward_pre_hook(lambda module, args: forward_modes.append(module.training))
    batches = (task_batch(config.pad_id, seed) for seed in range(3))
    train(model, batches, steps=3, on_step=lambda report: step_modes.append(model.training))
    assert forward_modes == [True] * 3 and step_modes == [True] * 3
    assert model.training and all(module.training for module in model.modules())
