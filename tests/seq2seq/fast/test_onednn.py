"""The oneDNN lever of the fast decoding path: a packed copy whose linears (encoder, decoder and
generator) compute nn.Linear's product (to float32 rounding), leaving the model as it was;
decoding on it gives the eager decoders' tokens; refused where oneDNN cannot run it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from common.masks import decoder_mask, padding_mask
from seq2seq.data import tasks
from seq2seq.fast import onednn
from seq2seq.fast.onednn import OneDnnLinear, packable_dtypes, with_onednn_linears
from seq2seq.fast.static_search import StaticBeam, StaticGreedy
from seq2seq.search.beam import beam_search
from seq2seq.search.greedy import greedy_decode
from tests.helpers import small_config
from variants import build

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN (mkldnn)")


def test_a_packed_linear_computes_the_linears_product():
    linear = nn.Linear(48, 80)
    x = torch.randn(3, 5, 48)  # leading dims kept, as nn.Linear keeps them
    expected = x.double() @ linear.weight.double().T + linear.bias.double()  # float64, by hand
    torch.testing.assert_close(OneDnnLinear(linear)(x).double(), expected, rtol=1e-5, atol=1e-5)


def test_every_linear_of_the_encoder_decoder_and_generator_is_packed_in_a_copy():
    model = build("fused", small_config(dropout=0.0), seed=0).eval()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    packed = with_onednn_linears(model)
    kinds = {name: type(module) for name, module in packed.named_modules()}
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    assert {name.split(".")[0] for name in linears} == {"encoder", "decoder", "generator"}
    assert all(kinds[name] is OneDnnLinear for name in linears)
    assert not any(type(module) is nn.Linear for module in packed.modules())  # none left unpacked
    assert all(type(module) is not OneDnnLinear for module in model.modules())  # the model is left
    assert all(torch.equal(model.state_dict()[name], value) for name, value in before.items())


def test_decoding_on_onednn_linears_gives_the_eager_tokens(copy_model):
    """float32 copy model: greedy tokens and beam hypotheses of the eager growing-cache decoders,
    two batches through one decoder."""
    model = copy_model.build("fused", torch.float32)
    arguments = dict(max_len=10, bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)
    greedy = StaticGreedy(model, onednn=True, **arguments)
    beam = StaticBeam(model, onednn=True, **arguments)
    for src in (copy_model.src[:32], copy_model.src[32:]):
        src_mask = padding_mask(src, 0)
        assert torch.equal(greedy(src, src_mask), greedy_decode(model, src, src_mask, **arguments))
        expected = beam_search(model, src, src_mask, **arguments)
        found = beam(src, src_mask)
        assert torch.equal(found.tokens, expected.tokens)
        torch.testing.assert_close(found.scores, expected.scores)


def test_onednn_is_refused_where_it_cannot_run():
    model = build("fused", small_config(dropout=0.0), seed=0).eval()
    need = r"oneDNN linears need a float32 model on a CPU .* got torch\.float64 on cpu"
    with pytest.raises(ValueError, match=need):
        with_onednn_linears(model.double())
    with pytest.raises(TypeError, match=r"onednn must be a bool, got int 1"):
        StaticGreedy(model, max_len=8, bos_id=1, eos_id=2, onednn=1)
    with pytest.raises(ValueError, match="onednn runs the step eagerly: give compile_mode None"):
        StaticBeam(model, max_len=8, bos_id=1, eos_id=2, onednn=True, compile_mode="default", freezing=True)


@pytest.mark.parametrize("variant", ["explicit", "einsum", "mathfirst", "torch"])
def test_a_model_without_packable_linears_is_refused_by_name(variant):
    """Only fused has an encoder, a decoder and a generator made of nn.Linear modules (the row compare.py's
    onednn row and the static decoders' onednn serve); the others are refused up front, never
    handed back as a copy with nothing packed."""
    model = build(variant, small_config(dropout=0.0), seed=0).eval()
    refused = (r"with_onednn_linears serves the fused row .*: variants\.\S+\.Transformer "
               r"(has no (encoder|decoder|generator)( and no \w+)* module|holds no nn\.Linear)")
    with pytest.raises(ValueError, match=refused):
        with_onednn_linears(model)


def test_a_packed_linear_refuses_backward_work():
    """Inference only: oneDNN's packed product has no backward, so an input that requires grad
    with grad enabled is refused, not handed a gradient of None; under no_grad it runs, and the
    packed copy requires no grad (a timing script may decode with grad mode on)."""
    linear = nn.Linear(8, 4)
    packed = OneDnnLinear(linear)
    x = torch.randn(2, 8, requires_grad=True)
    for call in (packed, packed.relu):
        with pytest.raises(RuntimeError, match=r"OneDnnLinear is inference-only .* torch\.no_grad"):
            call(x)
    with torch.no_grad():
        expected = x.double() @ linear.weight.double().T + linear.bias.double()
        torch.testing.assert_close(packed(x).double(), expected, rtol=1e-5, atol=1e-5)
    model = with_onednn_linears(build("fused", small_config(dropout=0.0), seed=0).eval())
    assert not any(parameter.requires_grad for parameter in model.parameters())  # a copy to decode with
    src, tgt = torch.randint(1, 19, (2, 5)), torch.randint(1, 19, (2, 4))
    assert not model(src, tgt, None, None).requires_grad  # in grad mode too: no graph to go back through


def test_the_packed_copy_is_a_snapshot_of_the_weights():
    """Documented: the copy holds the weights it was built from. After the model's weights
    change it still computes the old model's log-probs (and the changed model does not)."""
    model = build("fused", small_config(dropout=0.0), seed=0).eval()
    src, tgt = torch.randint(1, 19, (2, 5)), torch.randint(1, 19, (2, 4))
    with torch.no_grad():
        before = model(src, tgt, None, None)
        packed = with_onednn_linears(model)
        old = packed(src, tgt, None, None)
        for parameter in model.parameters():
            parameter.mul_(1.5)
        changed = model(src, tgt, None, None)
        assert torch.equal(packed(src, tgt, None, None), old)
    torch.testing.assert_close(old, before, rtol=1e-4, atol=1e-4)  # the old weights' function
    assert (changed - before).abs().max() > 1e-2  # ... which the changed model no longer computes


# --- bfloat16 weights -----------------------------------------------------------------------

BFLOAT16_ROUNDOFF = 2.0 ** -8  # bfloat16 keeps 8 significant bits
# oneDNN's bfloat16 kernels need AVX-512 (emulated without avx512_bf16 or amx_bf16)
BFLOAT16_KERNELS = pytest.mark.skipif(torch.bfloat16 not in packable_dtypes(),
                                      reason="oneDNN has no bfloat16 kernels on this CPU")


@BFLOAT16_KERNELS

def test_a_bfloat16_packed_linear_is_the_product_of_the_rounded_operands():
    """Input and weight rounded to bfloat16, their products summed in float32 (oneDNN's
    accumulator), the bias added and the sum rounded to bfloat16 once: within one rounding of
    the float64 product of the rounded operands, and handed back in float32."""
    linear = nn.Linear(48, 80)
    x = torch.randn(3, 5, 48)
    rounded = (x.bfloat16().double() @ linear.weight.bfloat16().double().T
               + linear.bias.bfloat16().double())  # float64, by hand
    with torch.no_grad():
        found = OneDnnLinear(linear, torch.bfloat16)(x)
    assert found.dtype == torch.float32
    assert ((found.double() - rounded).abs() <= BFLOAT16_ROUNDOFF * rounded.abs() + 1e-6).all()
    full = x.double() @ linear.weight.double().T + linear.bias.double()
    assert (found.double() - full).abs().max() > 1e-4  # bfloat16 arithmetic happened


@BFLOAT16_KERNELS
def test_bfloat16_weights_decode_the_float32_tokens_wherever_the_margin_exceeds_their_error(copy_model):
    """A trained model: its float32 greedy tokens (the readable search), and the bfloat16 copy
    teacher-forced on them. Where every step of a row has its top log-probability ahead of the
    runner-up by more than twice the largest difference between the two copies' log-probs, no
    argmax can flip, so the bfloat16 decoder must give that row's float32 tokens. Most rows of a
    trained model have such margins; the others may differ, and are counted, not required."""
    model = copy_model.build("fused", torch.float32)
    src, src_mask = copy_model.src, copy_model.src_mask
    arguments = dict(max_len=10, bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)
    expected = greedy_decode(model, src, src_mask, **arguments)  # (B, L) float32
    found = StaticGreedy(model, onednn=True, onednn_dtype=torch.bfloat16, **arguments)(src, src_mask)
    tgt_in, steps = expected[:, :-1], expected[:, 1:]  # (B, L - 1) each
    tgt_mask = decoder_mask(tgt_in, copy_model.config.pad_id)
    with torch.no_grad():
        float32 = model(src, tgt_in, src_mask, tgt_mask)  # (B, L - 1, V)
        bfloat16 = with_onednn_linears(model, torch.bfloat16)(src, tgt_in, src_mask, tgt_mask)
    decided = steps != copy_model.config.pad_id  # (B, L - 1): the steps each row decoded
    error = (float32 - bfloat16).abs().amax(dim=-1)[decided].max()
    assert error > BFLOAT16_ROUNDOFF  # the copy computed in bfloat16 (float32 copies differ by ~1e-6)
    top = float32.topk(2, dim=-1).values  # (B, L - 1, 2)
    margin = (top[..., 0] - top[..., 1]).masked_fill(~decided, float("inf"))
    safe = (margin > 2 * error).all(dim=1)  # (B,)
    # about two rows in three here (error 0.18): a quarter keeps the test from passing on no rows
    assert safe.float().mean() >= 0.25, (safe.float().mean(), error)
    width = min(found.shape[1], expected.shape[1])
    assert found.shape[1] == expected.shape[1] or not safe.all()
    assert torch.equal(found[safe, :width], expected[safe, :width])


def test_bfloat16_weights_need_the_onednn_lever_and_a_dtype_it_packs():
    model = build("fused", small_config(dropout=0.0), seed=0).eval()
    with pytest.raises(ValueError, match=r"onednn_dtype is the packed weights' dtype: give onednn=True"):
        StaticGreedy(model, max_len=8, bos_id=1, eos_id=2, onednn_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"torch\.float32 or torch\.bfloat16, got torch\.float16"):
        with_onednn_linears(model, torch.float16)


def test_a_cpu_without_onednn_bfloat16_kernels_is_refused_before_any_packing(monkeypatch):
    monkeypatch.setattr(onednn, "packable_dtypes", lambda: (torch.float32,))
    model = build("fused", small_config(dropout=0.0), seed=0).eval()
    with pytest.raises(ValueError, match=r"oneDNN has no torch\.bfloat16 kernels on this CPU"):
        with_onednn_linears(model, torch.bfloat16)
    assert isinstance(with_onednn_linears(model).generator, OneDnnLinear)  # float32 still packs
