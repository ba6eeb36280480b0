"""The paper's recipe: the learning-rate schedule, Adam's settings, the smoothed loss and the
sums DDP reduces, the recipe's validation, and one training step against a teacher-forcing
loss written out here.

The lockstep test in test_trainer.py runs ``train`` on both sides; here the expected loss
shares no code with ``seq2seq.training.recipe`` or ``common.masks``: the target shift, both masks, the
paper's label smoothing and the padding rule are spelled out below.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from common.weights import export_gradients, export_weights
from seq2seq.data import tasks
from seq2seq.data.tasks import task_batches
from seq2seq.training.recipe import Recipe, learning_rate, make_optimizer, smoothed_loss_sum, train_step
from seq2seq.training.trainer import train_steps
from tests.helpers import FLOAT64_TOL, small_config
from variants import VARIANTS, build

# --- schedule, Adam, loss -----------------------------------------------------------------


def test_learning_rate_is_equation_3():
    d_model, warmup = 64, 100
    assert learning_rate(1, d_model, warmup) == pytest.approx(64**-0.5 * 100**-1.5)
    assert learning_rate(100, d_model, warmup) == pytest.approx(64**-0.5 * 100**-0.5)  # the peak
    assert learning_rate(400, d_model, warmup) == pytest.approx(64**-0.5 * 400**-0.5)
    assert learning_rate(50, d_model, warmup, factor=2.0) == pytest.approx(2 * 64**-0.5 * 50e-3)
    rates = [learning_rate(step, d_model, warmup) for step in range(1, 300)]
    assert max(rates) == rates[99]
    with pytest.raises(ValueError, match="step"):
        learning_rate(0, d_model, warmup)


def test_optimizer_is_adam_with_the_papers_settings_and_schedule():
    config = small_config(dropout=0.0)
    model = build("torch", config, seed=0)
    optimizer, scheduler = make_optimizer(model, Recipe(warmup=5, lr_factor=2.0))
    assert isinstance(optimizer, torch.optim.Adam)
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
    batches = task_batches("copy", 4, vocab_size=19, min_len=1, max_len=6, seed=0)
    used = []
    for _ in range(8):
        used.append(optimizer.param_groups[0]["lr"])
        train_step(model, optimizer, scheduler, *next(batches), label_smoothing=0.1)
    assert used == pytest.approx([learning_rate(step, 32, 5, 2.0) for step in range(1, 9)])


def test_smoothed_loss_against_torch_cross_entropy():
    generator = torch.Generator().manual_seed(0)
    log_probs = torch.randn(3, 5, 11, generator=generator, dtype=torch.float64).log_softmax(-1)
    target = torch.randint(1, 11, (3, 5), generator=generator)
    target[1, 3:] = 0
    target[2, 1:] = 0
    flat = log_probs.flatten(0, 1), target.flatten()
    total, tokens = smoothed_loss_sum(log_probs, target, 0, 0.0)
    torch.testing.assert_close(total / tokens, F.nll_loss(*flat, ignore_index=0))
    # cross_entropy re-normalises its input, a no-op on log-probs
    total, tokens = smoothed_loss_sum(log_probs, target, 0, 0.1)
    torch.testing.assert_close(total / tokens, F.cross_entropy(*flat, ignore_index=0, label_smoothing=0.1))


def test_loss_sums_add_up_over_shards_and_give_the_mean():
    """What DDP's reduction rests on: per-shard sums and counts add up to the batch's, while
    per-shard means, averaged, are not the batch's mean when the shards hold unequal numbers of
    real tokens."""
    generator = torch.Generator().manual_seed(0)
    log_probs = torch.randn(5, 6, 11, generator=generator, dtype=torch.float64).log_softmax(-1)
    target = torch.randint(1, 11, (5, 6), generator=generator)
    target[0, 1:] = 0  # shard 0 (rows 0-2) holds fewer real tokens than shard 1 (rows 3-4)
    total, tokens = smoothed_loss_sum(log_probs, target, 0, 0.1)
    assert tokens == (target != 0).sum()
    torch.testing.assert_close(total / tokens, F.cross_entropy(log_probs.flatten(0, 1), target.flatten(),
                                                               ignore_index=0, label_smoothing=0.1))
    shards = [smoothed_loss_sum(log_probs[rows], target[rows], 0, 0.1) for rows in (slice(0, 3), slice(3, 5))]
    torch.testing.assert_close(sum(t for t, _ in shards) / sum(n for _, n in shards), total / tokens)
    assert abs(sum(t / n for t, n in shards) / 2 - total / tokens) > 1e-3


def test_bad_recipe_values_are_named():
    for changes, field in ((dict(warmup=0), "warmup"), (dict(lr_factor=0.0), "lr_factor"),
                           (dict(lr_factor=float("inf")), "lr_factor"),
                           (dict(label_smoothing=1.0), "label_smoothing")):
        with pytest.raises(ValueError, match=field):
            Recipe(**changes)


# --- one step against the written-out loss -------------------------------------------------


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
    (loss,) = train_steps(model, iter([(src, tgt)]), steps=1, recipe=Recipe(label_smoothing=0.3))
    assert loss == pytest.approx(expected.item(), rel=1e-12)
