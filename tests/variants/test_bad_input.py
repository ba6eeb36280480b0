"""Every variant x every bad input: the right exception, a message naming the problem, raised
before the model touches a single weight."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from common.masks import causal_mask
from common.random_batch import random_batch
from tests.helpers import small_config
from variants import build

CONFIG = small_config()  # src_vocab 23, tgt_vocab 19, max_seq_len 40, d_model 32, 4 heads
BATCH, SRC_LEN, TGT_LEN = 3, 7, 5


def good_inputs() -> dict[str, object]:
    """Valid arguments for every entry point: (3, 7) src, (3, 5) tgt, masks, memory, hidden."""
    src, tgt, src_mask, tgt_mask = random_batch(CONFIG, BATCH, SRC_LEN, TGT_LEN).inputs()
    generator = torch.Generator().manual_seed(1)
    return dict(
        src=src, tgt=tgt, src_mask=src_mask, tgt_mask=tgt_mask,
        memory=torch.randn(BATCH, SRC_LEN, CONFIG.d_model, generator=generator),
        hidden=torch.randn(BATCH, TGT_LEN, CONFIG.d_model, generator=generator),
    )


ENTRY_ARGS = {  # entry point -> the arguments it takes, in order
    "encode": ("src", "src_mask"),
    "decode": ("tgt", "memory", "src_mask", "tgt_mask"),
    "project": ("hidden",),
    "forward": ("src", "tgt", "src_mask", "tgt_mask"),
}


@dataclass(frozen=True)
class Case:
    entry: str  # encode / decode / project / forward
    change: Callable[[dict], dict]  # good inputs -> the arguments that replace some of them
    error: type[Exception]
    match: str  # regex the message must contain: the argument, what it got, what was expected
    model_device: str = "cpu"


def ids(shape, high, low=1) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(2))


def with_id(name: str, row: int, col: int, value: int) -> Callable[[dict], dict]:
    def change(good: dict) -> dict:
        changed = good[name].clone()
        changed[row, col] = value
        return {name: changed}
    return change


SRC_RANGE = r"src ids must lie in \[0, 23\) \(src_vocab_size=23\), got min "
TGT_RANGE = r"tgt ids must lie in \[0, 19\) \(tgt_vocab_size=19\), got min "
MEMORY_SHAPE = r"memory must have shape \(B=3, S, d_model=32\) to match tgt, got "
SRC_MASK_ENC = r"does not broadcast to \(B=3, H=4, T_query=7, T_key=7\)"
SRC_MASK_DEC = r"does not broadcast to \(B=3, H=4, T_query=5, T_key=7\)"
TGT_MASK = r"does not broadcast to \(B=3, H=4, T_query=5, T_key=5\)"

CASES = {
    # --- token ids: kind and dtype
    "src-list": Case("encode", lambda g: {"src": g["src"].tolist()}, TypeError,
                     r"src must be a torch\.Tensor, got list"),
    "src-float": Case("encode", lambda g: {"src": g["src"].float()}, TypeError,
                      r"src must be an integer tensor of token ids .*got dtype torch\.float32"),
    "src-bool": Case("forward", lambda g: {"src": g["src"] > 3}, TypeError,
                     r"src must be an integer tensor .*got dtype torch\.bool"),
    "src-uint8": Case("encode", lambda g: {"src": g["src"].to(torch.uint8)}, TypeError,
                      r"src must be an integer tensor .*\(torch\.int64 or torch\.int32\).*torch\.uint8"),
    "tgt-int16": Case("decode", lambda g: {"tgt": g["tgt"].short()}, TypeError,
                      r"tgt must be an integer tensor .*got dtype torch\.int16"),
    "tgt-float-forward": Case("forward", lambda g: {"tgt": g["tgt"].double()}, TypeError,
                              r"tgt must be an integer tensor .*got dtype torch\.float64"),
    # --- token ids: rank
    "src-rank-1": Case("encode", lambda g: {"src": g["src"][0]}, ValueError,
                       r"src must have shape \(B, length\), got \(7,\)"),
    "src-rank-1-forward": Case("forward", lambda g: {"src": g["src"][0]}, ValueError,
                               r"src must have shape \(B, length\), got \(7,\)"),
    "tgt-rank-3": Case("decode", lambda g: {"tgt": g["tgt"][..., None]}, ValueError,
                       r"tgt must have shape \(B, length\), got \(3, 5, 1\)"),
    "tgt-rank-1-forward": Case("forward", lambda g: {"tgt": g["tgt"][0]}, ValueError,
                               r"tgt must have shape \(B, length\), got \(5,\)"),
    # --- token ids: range (offending min/max and the vocabulary size)
    "src-id-too-high": Case("encode", with_id("src", 0, 0, 23), ValueError, SRC_RANGE + r"\d+, max 23"),
    "src-id-negative": Case("encode", with_id("src", 1, 2, -4), ValueError, SRC_RANGE + r"-4, max \d+"),
    "src-id-too-high-forward": Case("forward", with_id("src", 2, 0, 99), ValueError,
                                    SRC_RANGE + r"\d+, max 99"),
    "tgt-id-too-high": Case("decode", with_id("tgt", 2, 0, 19), ValueError, TGT_RANGE + r"\d+, max 19"),
    "tgt-id-in-src-vocab-only": Case("forward", with_id("tgt", 0, 1, 20), ValueError,
                                     TGT_RANGE + r"\d+, max 20"),
    # --- lengths (both numbers) and emptiness
    "src-too-long": Case("encode", lambda g: {"src": ids((3, 41), 23), "src_mask": None}, ValueError,
                         r"src length 41 exceeds max_seq_len 40"),
    "tgt-too-long": Case("decode", lambda g: {"tgt": ids((3, 45), 19), "tgt_mask": None, "src_mask": None},
                         ValueError, r"tgt length 45 exceeds max_seq_len 40"),
    "tgt-too-long-forward": Case("forward", lambda g: {"tgt": ids((3, 41), 19), "tgt_mask": None},
                                 ValueError, r"tgt length 41 exceeds max_seq_len 40"),
    "src-no-rows": Case("encode", lambda g: {"src": g["src"][:0], "src_mask": None}, ValueError,
                        r"src is empty: shape \(0, 7\)"),
    "src-no-tokens": Case("encode", lambda g: {"src": g["src"][:, :0], "src_mask": None}, ValueError,
                          r"src is empty: shape \(3, 0\)"),
    "tgt-no-tokens": Case("decode", lambda g: {"tgt": g["tgt"][:, :0], "tgt_mask": None}, ValueError,
                          r"tgt is empty: shape \(3, 0\)"),
    "tgt-no-tokens-forward": Case("forward", lambda g: {"tgt": g["tgt"][:, :0], "tgt_mask": None},
                                  ValueError, r"tgt is empty: shape \(3, 0\)"),
    # --- batches that do not pair up
    "src-tgt-batch-mismatch": Case("forward", lambda g: {"tgt": g["tgt"][:2], "tgt_mask": g["tgt_mask"][:2]},
                                   ValueError, r"src and tgt must have the same batch size, got 3 and 2"),
    "memory-wrong-batch": Case("decode", lambda g: {"memory": g["memory"][:2]}, ValueError,
                               MEMORY_SHAPE + r"\(2, 7, 32\)"),
    "memory-wrong-width": Case("decode", lambda g: {"memory": g["memory"][..., :16]}, ValueError,
                               MEMORY_SHAPE + r"\(3, 7, 16\)"),
    "memory-rank-2": Case("decode", lambda g: {"memory": g["memory"][0]}, ValueError,
                          MEMORY_SHAPE + r"\(7, 32\)"),
    "memory-empty": Case("decode", lambda g: {"memory": g["memory"][:, :0], "src_mask": None}, ValueError,
                         r"memory is empty: shape \(3, 0, 32\)"),
    "memory-integer": Case("decode", lambda g: {"memory": g["memory"].long()}, TypeError,
                           r"memory must be a floating-point tensor, got dtype torch\.int64"),
    "memory-list": Case("decode", lambda g: {"memory": g["memory"].tolist()}, TypeError,
                        r"memory must be a torch\.Tensor, got list"),
    # --- masks: dtype, then shape (the expected broadcast shape in the message)
    "src-mask-long": Case("encode", lambda g: {"src_mask": g["src_mask"].long()}, TypeError,
                          r"src_mask must be a bool tensor \(True = may attend\), got dtype torch\.int64"),
    "tgt-mask-float": Case("decode", lambda g: {"tgt_mask": g["tgt_mask"].float()}, TypeError,
                           r"tgt_mask must be a bool tensor \(True = may attend\), got dtype torch\.float32"),
    "tgt-mask-float-forward": Case("forward", lambda g: {"tgt_mask": g["tgt_mask"].float()}, TypeError,
                                   r"tgt_mask must be a bool tensor"),
    "src-mask-short-keys": Case("encode", lambda g: {"src_mask": g["src_mask"][..., :6]}, ValueError,
                                r"src_mask of shape \(3, 1, 1, 6\) " + SRC_MASK_ENC),
    "src-mask-wrong-heads": Case("encode", lambda g: {"src_mask": g["src_mask"].expand(3, 3, 1, 7)},
                                 ValueError, r"src_mask of shape \(3, 3, 1, 7\) " + SRC_MASK_ENC),
    "src-mask-rank-5": Case("encode", lambda g: {"src_mask": g["src_mask"][None]}, ValueError,
                            r"src_mask of shape \(1, 3, 1, 1, 7\) " + SRC_MASK_ENC),
    "src-mask-wrong-batch-decode": Case("decode", lambda g: {"src_mask": g["src_mask"][:2]}, ValueError,
                                        r"src_mask of shape \(2, 1, 1, 7\) " + SRC_MASK_DEC),
    "tgt-mask-wrong-length": Case("decode", lambda g: {"tgt_mask": causal_mask(4)}, ValueError,
                                  r"tgt_mask of shape \(1, 1, 4, 4\) " + TGT_MASK),
    "tgt-mask-wrong-length-forward": Case("forward", lambda g: {"tgt_mask": causal_mask(6)}, ValueError,
                                          r"tgt_mask of shape \(1, 1, 6, 6\) " + TGT_MASK),
    # --- masks of rank 2 or 3 whose first axis has the batch size: refused, with the layout to use
    "src-mask-batch-first-rank-3": Case("encode", lambda g: {"src_mask": g["src_mask"][:, 0]}, ValueError,
                                        r"src_mask of shape \(3, 1, 7\) is ambiguous: .* B=3.*"
                                        r"src_mask\[:, None\] of shape \(3, 1, 1, 7\)"),
    "src-mask-batch-first-rank-3-decode": Case("decode", lambda g: {"src_mask": g["src_mask"][:, 0]},
                                               ValueError, r"src_mask of shape \(3, 1, 7\) is ambiguous"),
    "src-key-mask-rank-2": Case("encode", lambda g: {"src_mask": g["src_mask"][:, 0, 0]}, ValueError,
                                r"src_mask of shape \(3, 7\) is ambiguous: .*"
                                r"src_mask\[:, None, None\] of shape \(3, 1, 1, 7\)"),
    "tgt-mask-batch-first-rank-3-forward": Case("forward", lambda g: {"tgt_mask": g["tgt_mask"][:, 0]},
                                                ValueError, r"tgt_mask of shape \(3, 5, 5\) is ambiguous"),
    # --- project
    "hidden-empty": Case("project", lambda g: {"hidden": g["hidden"][:0]}, ValueError,
                         r"hidden is empty: shape \(0, 5, 32\)"),
    "hidden-no-positions": Case("project", lambda g: {"hidden": g["hidden"][:, :0]}, ValueError,
                                r"hidden is empty: shape \(3, 0, 32\)"),
    "hidden-rank-2": Case("project", lambda g: {"hidden": g["hidden"][0]}, ValueError,
                          r"hidden must have shape \(B, T, d_model=32\), got \(5, 32\)"),
    "hidden-wrong-width": Case("project", lambda g: {"hidden": g["hidden"][..., :16]}, ValueError,
                               r"hidden must have last dimension d_model=32, got shape \(3, 5, 16\)"),
    "hidden-integer": Case("project", lambda g: {"hidden": g["hidden"].long()}, TypeError,
                           r"hidden must be a floating-point tensor, got dtype torch\.int64"),
    # --- devices, without CUDA: the meta device is a second device on every machine
    "model-on-meta-src-on-cpu": Case("encode", lambda g: {}, ValueError,
                                     r"src is on cpu but the model is on meta", model_device="meta"),
    "model-on-meta-forward": Case("forward", lambda g: {}, ValueError,
                                  r"src is on cpu but the model is on meta", model_device="meta"),
    "model-on-meta-hidden-on-cpu": Case("project", lambda g: {}, ValueError,
                                        r"hidden is on cpu but the model is on meta", model_device="meta"),
    "src-mask-on-meta": Case("encode", lambda g: {"src_mask": g["src_mask"].to("meta")}, ValueError,
                             r"src_mask is on meta but the model is on cpu"),
    "memory-on-meta": Case("decode", lambda g: {"memory": g["memory"].to("meta")}, ValueError,
                           r"memory is on meta but the model is on cpu"),
    "tgt-on-meta-forward": Case("forward", lambda g: {"tgt": g["tgt"].to("meta")}, ValueError,
                                r"tgt is on meta but the model is on cpu"),
}


class ParameterReads(TorchFunctionMode):
    """Records every torch operation that reads one of the model's parameters (not counting
    attribute reads such as ``.device``): "tensor work" in a way no variant's layout can hide."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.params = {id(p) for p in model.parameters()}
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", repr(func))
        if name != "__get__" and any(id(x) in self.params for x in tree_leaves((args, kwargs))):
            self.calls.append(name)
        return func(*args, **kwargs)


def model_and_call(variant: str, case: Case):
    model = build(variant, CONFIG, seed=0).eval().to(case.model_device)
    good = good_inputs()
    inputs = {**good, **case.change(good)}
    entry = getattr(model, case.entry) if case.entry != "forward" else model
    return model, lambda: entry(*(inputs[name] for name in ENTRY_ARGS[case.entry]))


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_bad_input_raises_a_clear_error(variant, case):
    _, call = model_and_call(variant, case)
    with pytest.raises(case.error, match=case.match):
        call()


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_bad_input_is_caught_before_any_tensor_work(variant, case):
    model, call = model_and_call(variant, case)
    reads = ParameterReads(model)
    with reads, pytest.raises(case.error):
        call()
    assert reads.calls == [], f"the model did tensor work before rejecting the input: {reads.calls}"


@pytest.mark.parametrize("entry", list(ENTRY_ARGS))
def test_parameter_reads_probe_sees_a_valid_call(variant, entry):
    """The probe above would notice tensor work: a valid call of each entry point records some."""
    model, call = model_and_call(variant, Case(entry, lambda g: {}, ValueError, ""))
    reads = ParameterReads(model)
    with reads, torch.no_grad():
        call()
    assert reads.calls


def test_every_entry_point_has_cases():
    assert {case.entry for case in CASES.values()} == set(ENTRY_ARGS)


# --- CUDA ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("model_on, inputs_on", [("cuda", "cpu"), ("cpu", "cuda")])
def test_model_and_inputs_on_different_devices(variant, model_on, inputs_on):
    model = build(variant, CONFIG, seed=0).eval().to(model_on)
    src, tgt, src_mask, tgt_mask = random_batch(CONFIG, device=inputs_on).inputs()
    with pytest.raises(ValueError, match=f"src is on {inputs_on}.* but the model is on {model_on}"):
        model(src, tgt, src_mask, tgt_mask)
    with pytest.raises(ValueError, match=f"src is on {inputs_on}.* but the model is on {model_on}"):
        model.encode(src, src_mask)


@pytest.mark.gpu
def test_out_of_range_ids_on_cuda_raise_instead_of_a_device_assert(variant):
    """A device-side assert would poison the CUDA context; the check must come first."""
    model = build(variant, CONFIG, seed=0).eval().cuda()
    src, tgt, src_mask, tgt_mask = random_batch(CONFIG, device="cuda").inputs()
    bad = src.clone()
    bad[0, 0] = CONFIG.src_vocab_size
    with pytest.raises(ValueError, match=SRC_RANGE + r"\d+, max 23"):
        model(bad, tgt, src_mask, tgt_mask)
    with torch.no_grad():
        out = model(src, tgt, src_mask, tgt_mask)
    torch.cuda.synchronize()  # would re-raise an asynchronous device-side assert
    assert torch.isfinite(out).all()


# --- the other side of the mask check: what does broadcast is accepted ------------------------

LOW_RANK_MASKS = {  # name -> (src_mask, tgt_mask) of rank < 4 that broadcast to (B, H, T_q, T_k)
    "src-mask-rank-1": (torch.tensor([True] * 5 + [False] * 2), None),
    "src-mask-rank-3": (torch.tensor([True] * 6 + [False])[None, None], None),
    "tgt-mask-rank-2": (None, causal_mask(TGT_LEN)[0, 0]),
}
@pytest.mark.parametrize("masks", list(LOW_RANK_MASKS.values()), ids=list(LOW_RANK_MASKS))
def test_masks_of_lower_rank_broadcast_like_their_4d_form(variant, masks):
    model = build(variant, CONFIG, seed=0).eval()
    src, tgt = good_inputs()["src"], good_inputs()["tgt"]
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt, *masks), model(src, tgt, *map(as_4d, masks)))


def as_4d(mask: torch.Tensor | None) -> torch.Tensor | None:
    """The (B, ., ., .) mask that ``mask`` broadcasts to: leading 1s, then the batch filled in."""
    if mask is None:
        return None
    return mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape)).expand(BATCH, -1, -1, -1)


# --- masks whose meaning would hang on a coincidence of sizes ---------------------------------


def test_a_batch_first_rank_3_mask_is_refused_when_the_batch_equals_n_heads(variant):
    """Read from the right, a (B, 1, S) mask is (H, T, S): with B = n_heads it would broadcast,
    one batch row's mask applied as each head's, and the output would be silently wrong."""
    model = build(variant, CONFIG, seed=0).eval()
    batch = CONFIG.n_heads
    src, _, src_mask, _ = random_batch(CONFIG, batch, SRC_LEN, TGT_LEN).inputs()  # (4, 1, 1, 7)
    with pytest.raises(ValueError, match=r"src_mask of shape \(4, 1, 7\) is ambiguous: .* B=4.* "
                                         r"H \(heads\).*src_mask\[:, None\] of shape \(4, 1, 1, 7\)"):
        model.encode(src, src_mask[:, 0])


def test_a_2d_key_mask_is_refused_when_the_batch_equals_the_query_length(variant):
    """Read from the right, a (B, S) key mask is (T_query, T_key): with B = S in the encoder's
    self-attention it would broadcast, row b's mask applied to query b of every sequence."""
    model = build(variant, CONFIG, seed=0).eval()
    src, _, src_mask, _ = random_batch(CONFIG, SRC_LEN, SRC_LEN, TGT_LEN).inputs()  # (7, 1, 1, 7)
    with pytest.raises(ValueError, match=r"src_mask of shape \(7, 7\) is ambiguous: .* B=7.* "
                                         r"T_query \(queries\).*src_mask\[:, None, None\]"):
        model.encode(src, src_mask[:, 0, 0])


def test_the_four_axis_form_of_a_refused_mask_is_accepted(variant):
    """The layout the message names runs, and equals the batch-first mask applied row by row."""
    model = build(variant, CONFIG, seed=0).eval()
    src, _, src_mask, _ = random_batch(CONFIG, CONFIG.n_heads, SRC_LEN, TGT_LEN).inputs()
    with torch.no_grad():
        whole = model.encode(src, src_mask[:, 0][:, None])
        rows = torch.cat([model.encode(src[b:b + 1], src_mask[b:b + 1]) for b in range(len(src))])
    torch.testing.assert_close(whole, rows)
