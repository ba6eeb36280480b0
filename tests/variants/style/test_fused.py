"""What is particular to the fused variant: the suite's masks on SDPA, dropout inside SDPA,
fused projections that hold the canonical matrices as row blocks, and a cache of keys and values
kept with the heads merged."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from common.masks import mask_scores
from common.random_batch import random_batch
from common.weights import export_weights, import_weights, transfer
from tests.helpers import FLOAT64_TOL, random_canonical, small_config
from variants import build
from variants.fused.model import Attention, sdpa_mask

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
NORM_MODES = pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])


def masked_inputs(dtype: torch.dtype, seed: int = 0):
    """(q, k, v) of shape (2, 4, 32) / (2, 6, 32) and a (2, 1, 4, 6) mask: batch 1 blocks every
    key, batch 0 blocks every key of query 0 and some keys of queries 1 and 2."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (3 * torch.randn(2, length, 32, generator=generator, dtype=torch.float64).to(dtype)
               for length in (4, 6, 6))  # scores of several units: far from uniform unmasked
    mask = torch.ones(2, 1, 4, 6, dtype=torch.bool)
    mask[1] = False
    mask[0, 0, 0] = False
    mask[0, 0, 1, 3:] = False
    mask[0, 0, 2, :2] = False
    return q, k, v, mask


def attention_without_projection(dtype: torch.dtype) -> Attention:
    """The fused attention of a 4-head small config with W_o = I, so ``attend`` returns the
    merged heads of SDPA itself."""
    attention = Attention(small_config()).to(dtype).eval()
    with torch.no_grad():
        attention.out_proj.weight.copy_(torch.eye(32))
        attention.out_proj.bias.zero_()
    return attention


def suite_attention(q, k, v, mask, n_heads: int = 4):
    """softmax(mask_fill(Q K^T / sqrt(Dh), finfo.min)) V per head in float64: what the
    from-scratch variants compute, written with ``common.masks`` and nothing of the fused variant."""
    q, k, v = (t.double().unflatten(-1, (n_heads, -1)).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5  # (B, H, T, S)
    out = mask_scores(scores, mask).softmax(dim=-1) @ v  # (B, H, T, Dh)
    return out.transpose(1, 2).flatten(2)  # (B, T, D)


# --- the mask conversion ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fully_masked_rows_attend_uniformly_as_in_the_from_scratch_variants(dtype):
    """A query with no key to attend to gets the mean of V, as the suite's finfo.min fill gives,
    and every other row the masked softmax. float16 is the case an added finfo.min alone gets
    wrong: CPU SDPA adds the mask in float32, where -65504 does not swamp the scores."""
    q, k, v, mask = masked_inputs(dtype)
    with torch.no_grad():
        actual = attention_without_projection(dtype).attend(q, k, v, sdpa_mask(mask, dtype))
    expected = suite_attention(q, k, v, mask)
    assert torch.isfinite(actual).all()
    mean_of_v = v.double().mean(dim=1, keepdim=True)  # (B, 1, D)
    torch.testing.assert_close(expected[1], mean_of_v[1].expand(4, -1), **FLOAT64_TOL)
    torch.testing.assert_close(expected[0, 0], mean_of_v[0, 0], **FLOAT64_TOL)
    # one rounding of the float64 result to dtype, at assert_close's defaults for dtype
    torch.testing.assert_close(actual, expected.to(dtype),
                               **(FLOAT64_TOL if dtype == torch.float64 else {}))


def test_gradients_through_fully_masked_rows_match_the_fill():
    """float64: the same gradients to Q, K and V as the finfo.min fill, which gives a fully
    masked row's query none (its zeroed query keeps it that way)."""
    q, k, v, mask = (t.requires_grad_() if t.is_floating_point() else t
                     for t in masked_inputs(torch.float64))
    cotangent = torch.randn(2, 4, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    attention = attention_without_projection(torch.float64)
    actual = torch.autograd.grad(attention.attend(q, k, v, sdpa_mask(mask, torch.float64)), (q, k, v),
                                 cotangent)
    expected = torch.autograd.grad(suite_attention(q, k, v, mask), (q, k, v), cotangent)
    for name, got, want in zip("qkv", actual, expected, strict=True):
        torch.testing.assert_close(got, want, **FLOAT64_TOL, msg=name)
    assert actual[0][1].abs().sum() == 0 and actual[0][0, 0].abs().sum() == 0


@pytest.mark.parametrize("shape", [(4, 6), (1, 4, 6), (2, 1, 4, 6)], ids=lambda s: f"rank-{len(s)}")
def test_sdpa_mask_blocks_with_minus_inf_and_opens_only_fully_masked_rows(shape):
    """Built once per stack from a mask of rank 2 to 4 (tests/variants/test_bad_input.py runs
    rank 1 through the model); 4-d, as SDPA's kernels want it."""
    mask = torch.ones(shape, dtype=torch.bool)
    mask[..., -1, :] = False  # the last query has no key
    mask[..., 0, 1] = False  # the first query may not see key 1
    converted = sdpa_mask(mask, torch.float32)
    assert converted.additive.ndim == converted.no_key.ndim == 4
    full = mask.reshape((1,) * (4 - mask.ndim) + shape)
    assert torch.equal(converted.no_key, ~full.any(dim=-1, keepdim=True))
    no_key_rows = converted.no_key.expand_as(full)
    assert (converted.additive[no_key_rows] == 0).all()  # opened to every key, query zeroed
    blocked = ~full & ~no_key_rows
    assert blocked.any() and (converted.additive[blocked] == -torch.inf).all()
    assert (converted.additive[full] == 0).all()
    assert sdpa_mask(None, torch.float32) is None


# --- dropout ----------------------------------------------------------------------------------


@NORM_MODES
def test_dropout_draws_match_explicit_site_for_site(norm_first):
    """Training with dropout, one seed: fused equals explicit in float64. SDPA drops the
    attention weights (not its output), and every other site and the order of the draws are
    explicit's: embeddings + positions, attention weights, sublayer outputs, FFN hidden."""
    config = small_config(dropout=0.3, norm_first=norm_first)
    explicit = build("explicit", config, seed=0).double().train()
    fused = build("fused", config).double().train()
    transfer(explicit, fused)
    batch = random_batch(config).inputs()
    outputs = []
    for model in (explicit, fused):
        torch.manual_seed(1234)
        outputs.append(model(*batch))
    torch.testing.assert_close(outputs[1], outputs[0], **FLOAT64_TOL)
    torch.manual_seed(4321)
    assert not torch.allclose(fused(*batch), outputs[0]), "another seed should draw other masks"


class RecordDropoutP(torch.overrides.TorchFunctionMode):
    """The ``dropout_p`` of every ``F.scaled_dot_product_attention`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.dropout_p: list[float] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is nn.functional.scaled_dot_product_attention:
            self.dropout_p.append(kwargs.get("dropout_p", 0.0))
        return func(*args, **kwargs)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_attention_dropout_probability_is_the_configs_in_training_and_zero_in_eval(dropout):
    config = small_config(dropout=dropout, n_layers=2)
    model = build("fused", config, seed=0)
    batch = random_batch(config).inputs()
    calls = 3 * config.n_layers  # encoder self-attention; decoder self- and cross-attention
    for training, expected in ((True, dropout), (False, 0.0)):
        with torch.no_grad(), RecordDropoutP() as record:
            model.train(training)(*batch)
        assert record.dropout_p == [expected] * calls, f"training={training}"


def test_the_attention_holds_a_probability_dropout_p_and_every_dropout_is_a_module():
    """SDPA takes the probability; ``dropout`` names an ``nn.Dropout`` wherever it appears."""
    config = small_config(dropout=0.3)
    model = build("fused", config)
    attentions = [module for module in model.modules() if isinstance(module, Attention)]
    assert len(attentions) == 3 * config.n_layers
    assert [attention.dropout_p for attention in attentions] == [0.3] * len(attentions)
    for name, module in model.named_modules():
        assert isinstance(getattr(module, "dropout", nn.Dropout()), nn.Dropout), name


def test_attention_dropout_changes_the_output_in_training_only():
    config = small_config(dropout=0.5)
    attention = Attention(config)
    q, k, v, mask = masked_inputs(torch.float32)
    converted = sdpa_mask(mask, torch.float32)
    with torch.no_grad():
        eval_out = attention.eval().attend(q, k, v, converted)
        torch.testing.assert_close(attention.attend(q, k, v, converted), eval_out, atol=0, rtol=0)
        torch.manual_seed(0)
        assert not torch.allclose(attention.train().attend(q, k, v, converted), eval_out)


# --- weights ----------------------------------------------------------------------------------


def test_fused_projections_hold_the_canonical_matrices_as_row_blocks():
    """qkv_proj = [W_q; W_k; W_v] and kv_proj = [W_k; W_v], as forward splits them; the map
    reads back every tensor bit for bit, also through explicit's separate projections."""
    config = small_config()
    state = random_canonical(config)
    model = build("fused", config)
    import_weights(model, state)

    def rows(prefix: str, projections: str, kind: str) -> torch.Tensor:
        return torch.cat([state[f"{prefix}.{proj}.{kind}"] for proj in projections.split()])

    for stack in ("encoder", "decoder"):
        for i, layer in enumerate(getattr(model, stack).layers):
            prefix = f"{stack}.layers.{i}"
            for kind in ("weight", "bias"):
                assert torch.equal(getattr(layer.self_attn.qkv_proj, kind),
                                   rows(f"{prefix}.self_attn", "wq wk wv", kind))
                if stack == "decoder":
                    assert torch.equal(getattr(layer.cross_attn.q_proj, kind),
                                       rows(f"{prefix}.cross_attn", "wq", kind))
                    assert torch.equal(getattr(layer.cross_attn.kv_proj, kind),
                                       rows(f"{prefix}.cross_attn", "wk wv", kind))
    exported = export_weights(model)
    assert all(torch.equal(exported[name], state[name]) for name in state)
    explicit, back = build("explicit", config), build("fused", config)
    transfer(model, explicit)
    transfer(explicit, back)
    for (name, param), other in zip(model.named_parameters(), back.parameters(), strict=True):
        assert torch.equal(param, other), name


# --- the cache ------------------------------------------------------------------------------


def test_the_cache_keeps_keys_and_values_with_the_heads_merged():
    """Per layer (B, t, D) self-attention and (B, S, D) cross-attention keys and values, as
    x W_k^T + b_k of the canonical matrices: layer 0's first key is that of the embedded BOS,
    E[bos] * sqrt(D) + PE[0] (PE[0] = sin 0, cos 0, ... = 0, 1, ...), under post-norm and eval."""
    config = small_config()
    state = {name: tensor.double() for name, tensor in random_canonical(config).items()}
    model = build("fused", config).double().eval()
    import_weights(model, state)
    generator = torch.Generator().manual_seed(0)
    memory = torch.randn(3, 5, config.d_model, generator=generator, dtype=torch.float64)  # (B, S, D)
    bos = torch.tensor([[1], [4], [7]])  # (B, 1)

    def keys(x: torch.Tensor, prefix: str, proj: str) -> torch.Tensor:
        return x @ state[f"{prefix}.{proj}.weight"].T + state[f"{prefix}.{proj}.bias"]

    with torch.no_grad():
        cache = model.start_cache(memory)
        for i, layer in enumerate(cache.layers):
            assert layer.self_keys.shape == layer.self_values.shape == (3, 0, config.d_model)
            for proj, got in (("wk", layer.cross_keys), ("wv", layer.cross_values)):
                torch.testing.assert_close(got, keys(memory, f"decoder.layers.{i}.cross_attn", proj),
                                           **FLOAT64_TOL)
        model.decode_step(bos, cache)
    embedded = state["tgt_embed.weight"][bos] * config.d_model**0.5 \
        + torch.tensor([0.0, 1.0], dtype=torch.float64).repeat(config.d_model // 2)  # (B, 1, D)
    assert all(layer.self_keys.shape == (3, 1, config.d_model) for layer in cache.layers)
    for proj, got in (("wk", cache.layers[0].self_keys), ("wv", cache.layers[0].self_values)):
        torch.testing.assert_close(got, keys(embedded, "decoder.layers.0.self_attn", proj), **FLOAT64_TOL)


def test_the_static_cache_writes_each_step_at_its_one_0d_position():
    """The static cache (variants/fused/static.py) holds one 0-d position, the tensor every layer
    shares and ``static_step`` takes; step t writes keys at slot t only, equal to those the
    growing cache appends at step t."""
    config = small_config()
    model = build("fused", config, seed=0).double().eval()
    generator = torch.Generator().manual_seed(0)
    memory = torch.randn(2, 4, config.d_model, generator=generator, dtype=torch.float64)
    ids = torch.tensor([[1, 5], [1, 6]])  # (B, 2): two steps
    with torch.no_grad():
        static = model.start_static_cache(memory, None, 6)
        growing = model.start_cache(memory)
        assert static.position.shape == ()
        assert all(layer.position is static.position for layer in static.layers)
        for t in range(2):
            model.static_step(ids[:, t:t + 1], torch.tensor(t), static)
            model.decode_step(ids[:, t:t + 1], growing)
            assert static.position.shape == () and int(static.position) == t
    for layer, grown in zip(static.layers, growing.layers, strict=True):
        torch.testing.assert_close(layer.self_keys[:, :2], grown.self_keys, **FLOAT64_TOL)
        assert not layer.self_keys[:, 2:].any()  # the slots not yet written stay zero


def test_a_static_step_run_again_at_an_earlier_position_sees_no_later_slot():
    """Four steps, then step 1 again with other ids: its output is the full decoder's at
    position 1 of the new prefix, as if slots 2 and 3 had never been written."""
    config = small_config()
    model = build("fused", config, seed=0).double().eval()
    generator = torch.Generator().manual_seed(1)
    memory = torch.randn(2, 4, config.d_model, generator=generator, dtype=torch.float64)
    ids = torch.tensor([[1, 5, 7, 8], [1, 6, 9, 3]])  # (B, 4)
    again = torch.tensor([[2], [4]])  # (B, 1): other ids at position 1
    with torch.no_grad():
        cache = model.start_static_cache(memory, None, 6)
        for t in range(4):
            model.static_step(ids[:, t:t + 1], torch.tensor(t), cache)
        hidden = model.static_step(again, torch.tensor(1), cache)  # (B, 1, D)
        prefix = torch.cat([ids[:, :1], again], dim=1)  # (B, 2)
        causal = torch.ones(1, 1, 2, 2, dtype=torch.bool).tril()
        expected = model.decode(prefix, memory, None, causal)[:, -1:]  # (B, 1, D)
    torch.testing.assert_close(hidden, expected, **FLOAT64_TOL)


@pytest.mark.parametrize("pad_id", [4, 1])
def test_a_static_step_sees_a_start_token_equal_to_padding(pad_id):
    """Marian's decoder starts with the padding id: the static cache opens slot 0 whatever its id
    (common.masks.target_padding_mask), and a padding id at a later slot stays hidden; each
    step equals the full decode under a mask written out here."""
    config = small_config(pad_id=pad_id, decoder_start="pad", positions="marian", final_norm=False)
    model = build("fused", config, seed=0).double().eval()
    generator = torch.Generator().manual_seed(2)
    memory = torch.randn(2, 4, config.d_model, generator=generator, dtype=torch.float64)
    ids = torch.tensor([[pad_id, 5, 7, 8], [pad_id, 6, pad_id, pad_id]])  # (B, 4): row 1 ended at 2
    keys = torch.tensor([[True, True, True, True], [True, True, False, False]])  # by hand
    with torch.no_grad():
        cache = model.start_static_cache(memory, None, 6)
        for t in range(4):
            hidden = model.static_step(ids[:, t:t + 1], torch.tensor(t), cache)  # (B, 1, D)
            causal = torch.ones(t + 1, t + 1, dtype=torch.bool).tril()  # (t + 1, t + 1)
            mask = keys[:, None, None, : t + 1] & causal  # (B, 1, t + 1, t + 1)
            expected = model.decode(ids[:, : t + 1], memory, None, mask)[:, -1:]
            torch.testing.assert_close(hidden, expected, **FLOAT64_TOL, msg=f"step {t}")
        assert cache.key_mask[:, :4].tolist() == keys.tolist()


def test_a_step_on_the_window_reads_only_its_positions_and_writes_into_the_cache():
    """Four steps on windows of 1..4 positions give the steps on the whole cache; every slot
    past the window holds NaN, which a step over the whole cache would read (a hidden slot's
    weight is 0, and 0 x NaN is NaN) and a window's step never does."""
    config = small_config()
    model = build("fused", config, seed=0).double().eval()
    generator = torch.Generator().manual_seed(3)
    memory = torch.randn(2, 4, config.d_model, generator=generator, dtype=torch.float64)
    src_mask = torch.tensor([[True, True, True, False], [True] * 4])[:, None, None, :]  # (B, 1, 1, S)
    ids = torch.tensor([[1, 5, 7, 8], [1, 6, 0, 0]])  # (B, 4): row 1 padded after two ids
    with torch.no_grad():
        whole, windowed = (model.start_static_cache(memory, src_mask, 6) for _ in range(2))
        for layer in windowed.layers:
            layer.self_keys.fill_(math.nan)
            layer.self_values.fill_(math.nan)
        for t in range(4):
            window = windowed.window(t + 1)
            assert window.max_len == t + 1 and window.position is windowed.position
            assert all(layer.self_keys.data_ptr() == full.self_keys.data_ptr()  # views, not copies
                       for layer, full in zip(window.layers, windowed.layers, strict=True))
            expected = model.static_step(ids[:, t:t + 1], torch.tensor(t), whole)
            got = model.static_step(ids[:, t:t + 1], torch.tensor(t), window)
            torch.testing.assert_close(got, expected, **FLOAT64_TOL, msg=f"step {t}")
    for layer, full in zip(windowed.layers, whole.layers, strict=True):  # written through the views
        torch.testing.assert_close(layer.self_keys[:, :4], full.self_keys[:, :4], **FLOAT64_TOL)
        assert layer.self_values[:, 4:].isnan().all()
    assert torch.equal(windowed.key_mask, whole.key_mask)
    with torch.no_grad():  # the same step on the whole cache reads the NaN slots
        assert model.static_step(ids[:, :1], torch.tensor(0), windowed).isnan().all()
    with pytest.raises(ValueError, match=r"position must lie in \[0, 2\)"):
        model.static_step(ids[:, :1], torch.tensor(2), windowed.window(2))
    for length in (0, 7):
        with pytest.raises(ValueError, match=rf"length must lie in \[1, max_len=6\], got {length}"):
            windowed.window(length)
    with pytest.raises(TypeError, match="length must be an int"):
        windowed.window(torch.tensor(2))


@pytest.mark.parametrize("src_mask_heads", [None, 1, 4], ids=["no-mask", "mask", "per-head-mask"])
def test_a_beam_cache_keeps_the_memory_once_per_source_and_steps_as_repeated_rows(src_mask_heads):
    """``beams=3``: the cross keys and values hold one row per source, the self-attention ones
    three, and each step gives what a cache of the memory repeated once per beam gives (the
    rows of one source carrying different ids)."""
    config = small_config()
    model = build("fused", config, seed=0).double().eval()
    generator = torch.Generator().manual_seed(4)
    memory = torch.randn(2, 4, config.d_model, generator=generator, dtype=torch.float64)  # 2 sources
    src_mask = None
    if src_mask_heads is not None:
        src_mask = torch.rand(2, src_mask_heads, 1, 4, generator=generator) > 0.3
        src_mask[..., 0] = True  # every head keeps a key
    ids = torch.randint(3, config.tgt_vocab_size, (6, 3), generator=generator)  # (B·3, 3 steps)
    ids[:, 0] = 1
    repeated_mask = None if src_mask is None else src_mask.repeat_interleave(3, dim=0)
    with torch.no_grad():
        grouped = model.start_static_cache(memory, src_mask, 5, beams=3)
        repeated = model.start_static_cache(memory.repeat_interleave(3, dim=0), repeated_mask, 5)
        assert grouped.batch_size == 6 and grouped.src_mask.shape[0] == 2
        assert all(layer.cross_keys.shape == (2, 4, config.d_model)
                   and layer.self_keys.shape == (6, 5, config.d_model) for layer in grouped.layers)
        for t in range(3):
            expected = model.static_step(ids[:, t:t + 1], torch.tensor(t), repeated)
            got = model.static_step(ids[:, t:t + 1], torch.tensor(t), grouped.window(t + 1))
            torch.testing.assert_close(got, expected, **FLOAT64_TOL, msg=f"step {t}")


# --- which SDPA kernel runs -------------------------------------------------------------------


def sdpa_kernels(model: nn.Module, batch) -> set[str]:
    """The aten SDPA kernels one forward ran, as the profiler names them."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        model(*batch)
    return {event.name for event in profile.events()
            if event.name.startswith("aten::_scaled_dot_product")}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_cpu_runs_the_flash_kernel_in_eval_and_the_math_one_with_dropout(dtype):
    """On CPU the fused kernel takes float64 too, so the float64 equivalence runs on it; SDPA's
    dropout has no CPU flash kernel, so a training step with dropout falls back to math."""
    config = small_config(dropout=0.1)
    model = build("fused", config, seed=0).to(dtype)
    batch = random_batch(config).inputs()
    with torch.no_grad():
        assert sdpa_kernels(model.eval(), batch) == {"aten::_scaled_dot_product_flash_attention_for_cpu"}
    assert sdpa_kernels(model.train(), batch) == {"aten::_scaled_dot_product_attention_math"}


# --- CUDA -------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_fully_masked_rows_attend_uniformly_on_cuda(dtype):
    q, k, v, mask = (t.cuda() for t in masked_inputs(dtype))
    with torch.no_grad():
        actual = attention_without_projection(dtype).cuda().attend(q, k, v, sdpa_mask(mask, dtype))
    torch.testing.assert_close(actual.cpu(), suite_attention(q, k, v, mask).to(dtype).cpu())
