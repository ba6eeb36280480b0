"""Dropout sits where ``nn.Transformer`` puts it, in every variant, in both norm modes.

The one architecture (docs/architecture.md) places it after embeddings + positions, on the
attention weights, on each sublayer's output before its residual, and on the feed-forward's
inner activation. Each variant, in train mode with dropout 0.25, runs under
``FixedDropoutMasks``: every random dropout mask is replaced by a fixed one that depends only on
the site's place in the forward pass. ``functional_forward`` below, the one architecture
(docs/architecture.md) written out on canonical weights with a dropout at each of those sites
and nowhere else, runs under the same stand-in. The variant's sites (shape and probability, in
order), log-probs and gradients must equal the functional forward's.

Why this cannot pass by accident:

- One op draws every dropout mask on CPU: ``aten.bernoulli_``, whether the dropout is
  ``nn.Dropout``, ``F.dropout`` or the math kernel that ``F.scaled_dot_product_attention`` runs
  with ``dropout_p > 0`` (the fused variant's attention, and ``nn.MultiheadAttention``'s inside
  the reference). The stand-in replaces it at the dispatcher, below autograd and below every
  Python wrapper, so a site nested inside a library call is caught like one in the variant's
  own code.
- A mask the stand-in did not make comes from torch's generator: the test asserts that the
  global RNG state is untouched, and any other random op raises.
- The masks differ from site to site (each drops about a quarter of its entries and scales the
  rest by 4/3). A missing, extra or moved site gives the next sites' masks to the wrong tensors
  or drops another tensor; log-probs then move by far more than the 1e-10 allowed in float64
  (``test_a_moved_or_missing_site_changes_the_log_probs`` shows it on the functional forward).
- The expected values share no code with any variant, and ``torch.nn.Transformer`` (the
  ``torch`` row) is a subject like the others, so the written-out sites are nn.Transformer's.
  Its fused "fast path" runs only in eval mode or without autograd; every module here is in
  train mode (asserted), and a fast path taken anyway would draw no masks and fail the sites.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from common.config import TransformerConfig
from common.random_batch import random_batch
from common.weights import export_gradients, export_weights, import_weights
from tests.helpers import FLOAT64_TOL, random_canonical, small_config
from variants import REFERENCE, VARIANTS, build

aten = torch.ops.aten

P_DROP = 0.25
# train mode with dropout, both norm modes; eps and pad_id off their defaults too
DROPOUT_CONFIGS = tuple(small_config(dropout=P_DROP, n_layers=2, norm_first=norm_first, norm_eps=1e-3,
                                     pad_id=5) for norm_first in (False, True))
MASK_SEED = 1000  # site k's mask comes from a generator seeded with MASK_SEED + k
RANDOM_OPS = {aten.bernoulli, aten.bernoulli_, aten.native_dropout, aten.rand, aten.rand_like,
              aten.randn, aten.randn_like, aten.uniform_, aten.normal_, aten.randint}


class FixedDropoutMasks(TorchDispatchMode):
    """Every ``bernoulli_`` draw (CPU dropout's keep-mask) becomes a fixed mask: site k (the
    k-th draw of the run) keeps the entries where a generator seeded with MASK_SEED + k draws a
    uniform number below the keep probability. ``sites`` lists (shape, drop probability) of each
    draw in order. Any other random op raises: a mask this mode does not make cannot match."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: list[tuple[tuple[int, ...], float]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.bernoulli_.float:
            noise = args[0]
            keep = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
            generator = torch.Generator().manual_seed(MASK_SEED + len(self.sites))
            mask = torch.rand(noise.shape, generator=generator, dtype=torch.float64) < keep
            self.sites.append((tuple(noise.shape), 1.0 - keep))
            return noise.copy_(mask)
        if func.overloadpacket in RANDOM_OPS:
            raise AssertionError(f"{func} draws randomness that FixedDropoutMasks does not replace")
        return func(*args, **kwargs)


def sinusoids(length: int, d_model: int) -> Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...), in float64."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    angle = pos / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)[:, :d_model]


def marian_sinusoids(length: int, d_model: int) -> Tensor:
    """Hugging Face's MarianSinusoidalPositionalEmbedding, in float64 (it builds it in float32):
    angle[pos, j] = pos / 10000^(2 (j // 2) / d); sin of the even j fill the first half, cos of
    the odd j the second."""
    j = torch.arange(d_model, dtype=torch.float64)
    angle = torch.arange(length, dtype=torch.float64)[:, None] / 10000 ** (2 * (j // 2) / d_model)
    return torch.cat([angle[:, 0::2].sin(), angle[:, 1::2].cos()], dim=1)


def fairseq_sinusoids(num_embeddings: int, d_model: int, padding_idx: int) -> Tensor:
    """fairseq's SinusoidalPositionalEmbedding.get_embedding (and Hugging Face FSMT's), in
    float64: rows are positions 0 .. num_embeddings - 1, the padding position's row zero."""
    half_dim = d_model // 2
    emb = math.log(10000) / (half_dim - 1)
    emb = torch.exp(torch.arange(half_dim, dtype=torch.float64) * -emb)
    emb = torch.arange(num_embeddings, dtype=torch.float64).unsqueeze(1) * emb.unsqueeze(0)
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1).view(num_embeddings, -1)
    if d_model % 2 == 1:
        emb = torch.cat([emb, torch.zeros(num_embeddings, 1, dtype=torch.float64)], dim=1)
    emb[padding_idx, :] = 0
    return emb


def make_positions(ids: Tensor, padding_idx: int) -> Tensor:
    """fairseq's make_positions: real tokens numbered from padding_idx + 1, padding at padding_idx."""
    mask = ids.ne(padding_idx).long()
    return torch.cumsum(mask, dim=1) * mask + padding_idx


def positions_for(config: TransformerConfig, ids: Tensor, fairseq_padding: bool = False) -> Tensor:
    """What each token's position adds, (L, D) or (B, L, D), as each source computes it: the
    paper's table, Marian's, or fairseq's at its positions. fairseq's positions are the token's
    index + pad_id + 1 (right padding), or with ``fairseq_padding`` its own ``make_positions``,
    which gives a padding token the zero row."""
    length, pad = ids.shape[1], config.pad_id
    if config.positions == "marian":
        return marian_sinusoids(length, config.d_model)
    if config.positions == "fairseq":
        table = fairseq_sinusoids(length + pad + 1, config.d_model, pad)
        return table[make_positions(ids, pad)] if fairseq_padding else table[pad + 1:]
    return sinusoids(length, config.d_model)


# each activation as its paper writes it: ReLU, GELU (Hendrycks & Gimpel: x Φ(x)), SiLU/swish (x σ(x))
ACTIVATIONS = {"relu": lambda x: x.clamp(min=0), "gelu": lambda x: x * (1 + torch.erf(x / math.sqrt(2))) / 2,
               "silu": lambda x: x / (1 + torch.exp(-x))}


def functional_forward(state: dict[str, Tensor], config: TransformerConfig, src: Tensor, tgt: Tensor,
                       src_mask: Tensor, tgt_mask: Tensor, p: float, move: str | None = None,
                       fairseq_padding: bool = False) -> Tensor:
    """The one architecture (docs/architecture.md) from canonical weights, with ``F.dropout(·, p)``
    at exactly the sites of ``nn.Transformer``; log-probs (B, T, V). ``move`` misplaces one site, to show that
    the comparison notices: "ff-after-w2", "no-attention-weights" or "no-residual". The config's
    activation, final norms and positions are written out here too (the feed-forward widths are
    the weights' own); ``fairseq_padding``: see ``positions_for``."""
    heads, d_model = config.n_heads, config.d_model
    activation = ACTIVATIONS[config.activation]

    def drop(x: Tensor) -> Tensor:
        return F.dropout(x, p)

    def linear(x: Tensor, name: str) -> Tensor:
        return x @ state[f"{name}.weight"].T + state[f"{name}.bias"]

    def layer_norm(x: Tensor, name: str) -> Tensor:
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).square().mean(-1, keepdim=True)  # biased, eps inside the root
        normalised = (x - mean) / torch.sqrt(var + config.norm_eps)
        return normalised * state[f"{name}.weight"] + state[f"{name}.bias"]

    def embed(table: str, ids: Tensor) -> Tensor:
        return drop(state[table][ids] * math.sqrt(d_model) + positions_for(config, ids, fairseq_padding))

    def attention(x: Tensor, memory: Tensor, mask: Tensor, name: str) -> Tensor:
        def heads_of(t: Tensor, proj: str) -> Tensor:
            return linear(t, f"{name}.{proj}").unflatten(-1, (heads, -1)).transpose(1, 2)

        q, k, v = heads_of(x, "wq"), heads_of(memory, "wk"), heads_of(memory, "wv")
        scores = q @ k.transpose(-2, -1) / math.sqrt(d_model // heads)  # (B, H, T, S)
        weights = scores.masked_fill(~mask, -math.inf).softmax(-1)
        if move != "no-attention-weights":
            weights = drop(weights)
        return linear((weights @ v).transpose(1, 2).flatten(2), f"{name}.wo")

    def feed_forward(x: Tensor, name: str) -> Tensor:
        if move == "ff-after-w2":
            return drop(linear(activation(linear(x, f"{name}.w1")), f"{name}.w2"))
        return linear(drop(activation(linear(x, f"{name}.w1"))), f"{name}.w2")

    def residual(x: Tensor, sublayer, norm: str) -> Tensor:
        if config.norm_first:
            out = sublayer(layer_norm(x, norm))  # cross-attention: the query only is normalised
            return x + (out if move == "no-residual" else drop(out))
        return layer_norm(x + drop(sublayer(x)), norm)

    def encoder_layer(x: Tensor, prefix: str) -> Tensor:
        x = residual(x, lambda h: attention(h, h, src_mask, f"{prefix}.self_attn"), f"{prefix}.norm1")
        return residual(x, lambda h: feed_forward(h, f"{prefix}.ff"), f"{prefix}.norm2")

    def decoder_layer(y: Tensor, memory: Tensor, prefix: str) -> Tensor:
        y = residual(y, lambda h: attention(h, h, tgt_mask, f"{prefix}.self_attn"), f"{prefix}.norm1")
        y = residual(y, lambda h: attention(h, memory, src_mask, f"{prefix}.cross_attn"), f"{prefix}.norm2")
        return residual(y, lambda h: feed_forward(h, f"{prefix}.ff"), f"{prefix}.norm3")

    x = embed("src_embed.weight", src)
    for i in range(config.n_layers):
        x = encoder_layer(x, f"encoder.layers.{i}")
    memory = layer_norm(x, "encoder.norm") if config.final_norm else x
    y = embed("tgt_embed.weight", tgt)
    for i in range(config.n_layers):
        y = decoder_layer(y, memory, f"decoder.layers.{i}")
    hidden = layer_norm(y, "decoder.norm") if config.final_norm else y
    return linear(hidden, "generator").log_softmax(-1)


def loss_of(log_probs: Tensor, labels: Tensor, pad_id: int) -> Tensor:
    return F.nll_loss(log_probs.flatten(0, 1), labels.flatten(), ignore_index=pad_id)


def expected_run(config: TransformerConfig, move: str | None = None):
    """The functional forward in float64 on small_config's random canonical weights: its sites,
    log-probs and the gradients of a loss, under canonical names."""
    batch = random_batch(config)
    state = {name: t.double().requires_grad_() for name, t in random_canonical(config).items()}
    with FixedDropoutMasks() as masks:
        log_probs = functional_forward(state, config, batch.src, batch.tgt, batch.src_mask,
                                       batch.tgt_mask, config.dropout, move)
        loss_of(log_probs, batch.labels, config.pad_id).backward()
    return masks.sites, log_probs.detach(), {name: t.grad for name, t in state.items()}


def test_the_stand_in_replaces_dropouts_mask_and_touches_no_generator():
    x = torch.ones(4, 50, dtype=torch.float64)
    rng = torch.get_rng_state()
    with FixedDropoutMasks() as masks:
        first, second = F.dropout(x, P_DROP), torch.nn.Dropout(P_DROP)(x)
    with FixedDropoutMasks():
        again = F.dropout(x, P_DROP)
    assert torch.equal(torch.get_rng_state(), rng)
    assert masks.sites == [((4, 50), P_DROP), ((4, 50), P_DROP)]
    assert torch.equal(first, again)  # site 0 is site 0 in every run
    assert not torch.equal(first, second)  # site 1 has another mask
    for out in (first, second):
        assert set(out.unique().tolist()) == {0.0, 1 / (1 - P_DROP)}
        assert 0.15 < (out == 0).double().mean() < 0.35


@pytest.mark.parametrize("config", DROPOUT_CONFIGS, ids=["post-norm", "pre-norm"])
def test_dropout_sites_match_the_written_out_architecture(variant, config):
    sites, log_probs, grads = expected_run(config)
    assert len(sites) == 2 + 4 * config.n_layers + 6 * config.n_layers  # embeddings, layers
    model = build(variant, config)
    import_weights(model, random_canonical(config))
    model.double().train()
    assert all(module.training for module in model.modules())  # no eval-only fast path
    batch = random_batch(config)
    rng = torch.get_rng_state()
    with FixedDropoutMasks() as masks:
        actual = model(*batch.inputs())
        loss_of(actual, batch.labels, config.pad_id).backward()
    assert torch.equal(torch.get_rng_state(), rng), "a dropout drew its mask from torch's generator"
    assert masks.sites == sites, f"{variant}'s dropout sites (shape, p), in order, differ"
    torch.testing.assert_close(actual, log_probs, **FLOAT64_TOL)
    actual_grads = export_gradients(model)
    for name, grad in grads.items():
        torch.testing.assert_close(actual_grads[name], grad, **FLOAT64_TOL, msg=name)


@pytest.mark.parametrize("config", DROPOUT_CONFIGS, ids=["post-norm", "pre-norm"])
def test_dropout_changes_the_train_mode_output(config):
    """The masks matter: the same weights in eval mode give other log-probs."""
    _, log_probs, _ = expected_run(config)
    model = build(VARIANTS[0], config)
    import_weights(model, random_canonical(config))
    with torch.no_grad():
        eval_log_probs = model.double().eval()(*random_batch(config).inputs())
    assert (eval_log_probs - log_probs).abs().max() > 0.1


@pytest.mark.parametrize("move", ["ff-after-w2", "no-attention-weights", "no-residual"])
def test_a_moved_or_missing_site_changes_the_log_probs(move):
    """The comparison above on a misplaced site: far outside the 1e-10 it allows, in the sites
    too where a site's shape or count changes (a moved site of the same shape changes only the
    numbers)."""
    config = DROPOUT_CONFIGS[1]  # pre-norm: "no-residual" drops the residuals' dropout there
    sites, log_probs, _ = expected_run(config)
    moved_sites, moved, _ = expected_run(config, move)
    assert (moved - log_probs).abs().max() > 0.01
    assert moved_sites != sites


def test_the_functional_forward_is_the_reference_in_eval_mode():
    """Without dropout, the written-out forward is nn.Transformer's function (so the train-mode
    comparison above tests dropout sites, not a second architecture)."""
    config = DROPOUT_CONFIGS[0]
    model = build(REFERENCE, config)
    import_weights(model, random_canonical(config))
    batch = random_batch(config)
    state = {name: t.double() for name, t in export_weights(model).items()}
    with torch.no_grad():
        expected = model.double().eval()(*batch.inputs())
        actual = functional_forward(state, config, batch.src, batch.tgt, batch.src_mask,
                                    batch.tgt_mask, p=0.0)
    torch.testing.assert_close(actual, expected, **FLOAT64_TOL)
