"""The int8 lever of the fast decoding path: a copy whose linears (encoder, decoder and
generator) hold int8 weights and multiply in int8, each within the error its two roundings
allow (the weight's, per output channel; the input's, per call), leaving the model as it was;
its greedy tokens are float32's wherever the margins exceed that error; refused by name."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor, nn

from common.masks import decoder_mask, padding_mask
from seq2seq.data import tasks
from seq2seq.fast import int8
from seq2seq.fast.int8 import Int8Linear, fbgemm_packing, int8_available, with_int8_linears
from seq2seq.fast.static_search import StaticGreedy, StaticNextToken
from seq2seq.search.greedy import greedy_decode
from tests.helpers import small_config
from variants import build

pytestmark = pytest.mark.skipif(not int8_available(), reason="needs PyTorch's fbgemm quantized engine (x86)")

EPS32 = torch.finfo(torch.float32).eps
WEIGHT_LEVELS = 127  # int8 weights in [-127, 127], symmetric: a row's step is max|W[o]| / 127
INPUT_LEVELS = 127  # a call's input on 7 bits (0..127 with a zero point): step = its range / 127


def rounding_bound(weight: Tensor, bias: Tensor | None, x: Tensor) -> Tensor:
    """(N, D_out): how far an int8 product may lie from ``x @ W.T + b``, derived in float64 from
    the two roundings alone. The weight row o rounded to steps s_o = max|W[o]| / 127 moves each
    entry by s_o / 2 at most, so the product by s_o / 2 * ||x_n||_1; the input, rounded per call
    to steps s_x = (max(x, 0) - min(x, 0)) / 127 (a nudged zero point keeps each entry within
    s_x / 2), moves it by s_x / 2 * ||Wq[o]||_1 <= s_x / 2 * (||W[o]||_1 + D_in s_o / 2); and the
    float32 arithmetic around the exact int32 sum (the input's scaling, the output's rescale and
    bias) adds a few roundings of the largest term, 8 eps32 (||Wq[o]||_1 (max|x| + s_x) + |b_o|)."""
    weight, x = weight.double(), x.double()  # (D_out, D_in), (N, D_in)
    bias = torch.zeros(weight.shape[0], dtype=torch.float64) if bias is None else bias.double()
    s_w = weight.abs().amax(dim=1) / WEIGHT_LEVELS  # (D_out,)
    s_x = (x.max().clamp(min=0) - x.min().clamp(max=0)) / INPUT_LEVELS  # ()
    weight_l1 = weight.abs().sum(dim=1) + weight.shape[1] * s_w / 2  # (D_out,): ||Wq[o]||_1 at most
    from_weight = x.abs().sum(dim=1, keepdim=True) * s_w / 2  # (N, D_out)
    from_input = s_x / 2 * weight_l1  # (D_out,)
    arithmetic = 8 * EPS32 * (weight_l1 * (x.abs().max() + s_x) + bias.abs())  # (D_out,)
    return from_weight + from_input + arithmetic


def exact(linear: nn.Linear, x: Tensor) -> Tensor:
    """The float64 product the int8 one stands for."""
    bias = 0.0 if linear.bias is None else linear.bias.double()
    return x.double() @ linear.weight.double().T + bias


def test_an_int8_linear_lies_within_its_rounding_bound():
    """Leading dims kept; inputs of mixed signs and scales (a range set by a few large
    entries, as activations have); and it really multiplied in int8 (error well above float32's)."""
    torch.manual_seed(0)
    linear = nn.Linear(48, 80)
    x = torch.randn(3, 5, 48) * torch.logspace(-2, 1, 48)  # (3, 5, D_in)
    with torch.no_grad():
        found = Int8Linear(linear)(x)
    assert found.shape == (3, 5, 80) and found.dtype == torch.float32
    error = (found.double() - exact(linear, x)).abs()
    bound = rounding_bound(linear.weight, linear.bias, x.flatten(0, 1)).view(3, 5, 80)
    assert (error <= bound).all(), (error / bound).max()
    assert error.max() > 1e3 * EPS32 * exact(linear, x).abs().max()  # int8, not float32


def test_the_weight_is_held_in_int8_per_output_channel():
    """Each row's integers in [-127, 127] on its own step, max|W[o]| / 127 (so a row of small
    weights keeps its precision: per channel, not per tensor), within half a step of W."""
    torch.manual_seed(0)
    linear = nn.Linear(16, 6, bias=False)
    with torch.no_grad():
        linear.weight[0] *= 1e-3  # a row far smaller than the rest
        linear.weight[3] = 0.0  # and one of zeros
    values, steps = Int8Linear(linear).int8_weight()
    assert values.dtype == torch.int8 and values.shape == (6, 16) and steps.shape == (6,)
    assert values.abs().max() <= WEIGHT_LEVELS and (values[3] == 0).all()
    expected = linear.weight.detach().double().abs().amax(dim=1) / WEIGHT_LEVELS
    kept = expected > 0
    torch.testing.assert_close(steps[kept], expected[kept], rtol=1e-6, atol=0)
    error = (values.double() * steps[:, None] - linear.weight.detach().double()).abs()
    assert (error <= steps[:, None] / 2 * (1 + 1e-6)).all()


def test_every_linear_of_a_forward_lies_within_its_bound_and_so_do_the_log_probs():
    """Each int8 linear of the copy, on the inputs it meets in a forward (hooks), against the
    model's float linear of the same name; then the generator's bound carried through
    log_softmax, which moves by twice a logit's change at most."""
    model = build("fused", small_config(dropout=0.0), seed=0).eval()
    quantized = with_int8_linears(model)
    float_linears = dict(model.named_modules())
    seen: dict[str, Tensor] = {}
    hooks = [module.register_forward_hook(
        lambda module, args, output, name=name: seen.update({name: (args[0], output)}))
        for name, module in quantized.named_modules() if isinstance(module, Int8Linear)]
    src, tgt = torch.randint(1, 23, (3, 7)), torch.randint(1, 19, (3, 6))
    src_mask, tgt_mask = padding_mask(src, 0), decoder_mask(tgt, 0)
    with torch.no_grad():
        log_probs = quantized(src, tgt, src_mask, tgt_mask)  # (B, T, V)
    for hook in hooks:
        hook.remove()
    assert len(seen) == sum(isinstance(module, nn.Linear) for module in model.modules())
    for name, (x, output) in seen.items():
        linear = float_linears[name]
        flat = x.reshape(-1, x.shape[-1])
        error = (output.double().reshape(flat.shape[0], -1) - exact(linear, flat)).abs()
        assert (error <= rounding_bound(linear.weight, linear.bias, flat)).all(), name
    hidden = seen["generator"][0]  # the copy's decoder output, the generator's input
    flat = hidden.reshape(-1, hidden.shape[-1])
    bound = rounding_bound(model.generator.weight, model.generator.bias, flat).amax(dim=1)  # (B T,)
    expected = torch.log_softmax(exact(model.generator, flat), dim=-1)
    error = (log_probs.double().reshape(expected.shape) - expected).abs().amax(dim=1)
    assert (error <= 2 * bound).all()


def static_log_probs(model: nn.Module, src: Tensor, src_mask: Tensor, tokens: Tensor) -> Tensor:
    """(B, L - 1, V): the log-probs the static greedy decoder's steps compute on ``model`` when
    its batch's tokens so far are ``tokens`` (B, L)'s, one step per prefix (pads after EOS fed
    as the decoder feeds them)."""
    step = StaticNextToken(model, tokens.shape[1])
    with torch.no_grad():
        step.start(src, src_mask)
        return torch.stack([step(tokens[:, :length]) for length in range(1, tokens.shape[1])], dim=1)


def test_int8_greedy_tokens_are_float32s_wherever_the_margins_exceed_their_error(copy_model):
    """A trained model. At a step where the float32 top log-probability leads every other by
    more than twice the largest difference between the two copies' log-probs, the int8 argmax
    cannot differ. The int8 product quantizes its input per call over the whole batch, so a
    row's log-probs depend on the batch it is in: the rows are narrowed to a batch in which
    every step of every row has such a margin, the int8 steps teacher-forced on that batch's
    float32 tokens (by induction the int8 decoder then sees exactly those prefixes), and the
    int8 static greedy decoder must give those tokens. Most rows stay (the rest may differ)."""
    model = copy_model.build("fused", torch.float32)
    quantized = with_int8_linears(model)
    pad = copy_model.config.pad_id
    arguments = dict(max_len=10, bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)
    rows = torch.arange(copy_model.src.shape[0])
    while True:  # drop the rows without the margin, until every row left has it
        src, src_mask = copy_model.src[rows], copy_model.src_mask[rows]
        expected = greedy_decode(model, src, src_mask, **arguments)  # (B, L) float32
        tgt_in = expected[:, :-1]  # (B, L - 1)
        with torch.no_grad():
            float32 = model(src, tgt_in, src_mask, decoder_mask(tgt_in, pad))  # (B, L - 1, V)
        error = (float32 - static_log_probs(quantized, src, src_mask, expected)).abs().amax(dim=-1)
        assert error.max() > 1e3 * EPS32  # the copy computed in int8 (float32 copies differ by ~1e-6)
        top = float32.topk(2, dim=-1).values  # (B, L - 1, 2)
        decided = expected[:, 1:] != pad  # (B, L - 1): after EOS a row is fed pads, not decided
        safe = ((top[..., 0] - top[..., 1] > 2 * error) | ~decided).all(dim=1)  # (B,)
        if safe.all():
            break
        rows = rows[safe]
    assert len(rows) >= copy_model.src.shape[0] // 2, len(rows)  # a test that rests on rows
    assert torch.equal(StaticGreedy(quantized, **arguments)(src, src_mask), expected)


def test_a_rows_int8_log_probs_depend_on_its_batch():
    """Documented: each call quantizes its input over the whole batch, so a row decoded beside
    others gives (slightly) other log-probs than alone; float32 gives the same to rounding."""
    model = build("fused", small_config(dropout=0.0), seed=0).eval()
    quantized = with_int8_linears(model)
    src, tgt = torch.randint(1, 23, (4, 7)), torch.randint(1, 19, (4, 6))
    src[1:] *= 0  # other rows of another range (pads)
    with torch.no_grad():
        alone, beside = quantized(src[:1], tgt[:1], None, None), quantized(src, tgt, None, None)[:1]
        float32 = model(src[:1], tgt[:1], None, None), model(src, tgt, None, None)[:1]
    assert (alone - beside).abs().max() > 1e3 * EPS32
    torch.testing.assert_close(*float32)


def test_the_copy_holds_only_int8_linears_and_the_model_is_left_as_it_was():
    model = build("fused", small_config(dropout=0.0, share_embeddings=True, src_vocab_size=19), seed=0).eval()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    quantized = with_int8_linears(model)
    kinds = {name: type(module) for name, module in quantized.named_modules()}
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    assert {name.split(".")[0] for name in linears} == {"encoder", "decoder", "generator"}
    assert all(kinds[name] is Int8Linear for name in linears)
    assert not any(isinstance(module, nn.Linear) for module in quantized.modules())
    assert not any(isinstance(module, Int8Linear) for module in model.modules())
    assert all(torch.equal(model.state_dict()[name], value) for name, value in before.items())
    assert model.generator.weight is model.tgt_embed.weight  # the model's tie kept
    assert not any(parameter.requires_grad for parameter in quantized.parameters())


def test_the_copy_is_a_snapshot_of_the_weights():
    model = build("fused", small_config(dropout=0.0), seed=0).eval()
    src, tgt = torch.randint(1, 19, (2, 5)), torch.randint(1, 19, (2, 4))
    with torch.no_grad():
        quantized = with_int8_linears(model)
        old = quantized(src, tgt, None, None)
        for parameter in model.parameters():
            parameter.mul_(1.5)
        assert torch.equal(quantized(src, tgt, None, None), old)


def test_the_packing_engine_is_fbgemm_whatever_the_process_chose_and_is_given_back(monkeypatch):
    """A copy packed while another engine is the process's setting computes what one packed
    under the default computes, and the setting is as it was afterwards."""
    model = build("fused", small_config(dropout=0.0), seed=0).eval()
    src, tgt = torch.randint(1, 19, (2, 5)), torch.randint(1, 19, (2, 4))
    with torch.no_grad():
        default = with_int8_linears(model)(src, tgt, None, None)
    # qnnpack's kernels differ from fbgemm's well beyond float32 rounding (onednn's to ~1e-6)
    other = next(engine for engine in ("qnnpack", "onednn")
                 if engine in torch.backends.quantized.supported_engines)
    chosen = torch.backends.quantized.engine
    try:
        torch.backends.quantized.engine = other
        with torch.no_grad():
            packed_there = with_int8_linears(model)(src, tgt, None, None)
        assert torch.backends.quantized.engine == other
    finally:
        torch.backends.quantized.engine = chosen
    assert torch.equal(packed_there, default)


def test_packing_silences_the_quantized_tensor_deprecation_and_nothing_else():
    message = ("torch.quantize_per_tensor, torch.quantize_per_channel and other quantized tensor creation "
               "functions that produce tensors with dtype torch.qint8 are deprecated")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with fbgemm_packing():
            warnings.warn(message, UserWarning, stacklevel=1)
            warnings.warn("something else", UserWarning, stacklevel=1)
        warnings.warn(message, UserWarning, stacklevel=1)  # outside: the user's own filters
    assert [str(warning.message) for warning in caught] == ["something else", message]


@pytest.mark.parametrize("variant", ["explicit", "einsum", "mathfirst", "torch"])
def test_a_model_without_linears_to_quantize_is_refused_by_name(variant):
    model = build(variant, small_config(dropout=0.0), seed=0).eval()
    refused = (r"with_int8_linears serves the fused row .*: variants\.\S+\.Transformer "
               r"(has no (encoder|decoder|generator)( and no \w+)* module|holds no nn\.Linear)")
    with pytest.raises(ValueError, match=refused):
        with_int8_linears(model)


def test_a_model_int8_cannot_run_is_refused_before_any_copy(monkeypatch):
    model = build("fused", small_config(dropout=0.0), seed=0).eval()
    with pytest.raises(ValueError, match=r"int8 linears need a float32 model on the CPU, got torch\.float64"):
        with_int8_linears(model.double())
    monkeypatch.setattr(int8, "int8_available", lambda: False)
    with pytest.raises(ValueError, match=r"PyTorch's fbgemm quantized engine \(x86 CPUs\); this build has"):
        with_int8_linears(model.float())


def test_an_int8_linear_refuses_backward_work():
    """Inference only: an input that requires grad with grad enabled is refused, not handed a
    product no gradient can go back through; under no_grad it runs."""
    linear = Int8Linear(nn.Linear(8, 4))
    x = torch.randn(2, 8, requires_grad=True)
    for call in (linear, linear.relu):
        with pytest.raises(RuntimeError, match=r"Int8Linear is inference-only .* torch\.no_grad"):
            call(x)
    with torch.no_grad():
        assert linear(x).shape == linear.relu(x).shape == (2, 4)
