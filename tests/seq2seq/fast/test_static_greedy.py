"""The static-shape cached step (fused's ``start_static_cache``/``static_step``) and the greedy loop
on it (``seq2seq.fast.static_search``): the step's log-probs equal the growing cache's and the full
decode's at every position; the loop's tokens equal ``greedy_decode``'s; it stops at EOS, refills
its cache for the next batch, and refuses bad arguments by name; compiled, the step is one graph
whose log-probs are the eager step's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from common.config import TransformerConfig
from common.masks import decoder_mask, padding_mask
from common.random_batch import random_batch
from common.weights import export_weights
from seq2seq.data import tasks
from seq2seq.fast.static_search import StaticBeam, StaticGreedy, StaticNextToken, static_greedy_decode
from seq2seq.search.beam import beam_search
from seq2seq.search.greedy import greedy_decode
from tests.helpers import FLOAT64_TOL, small_config
from tests.seq2seq.search.test_greedy import ScriptedModel
from variants import build

PAD, BOS, EOS = 0, 1, 2


def fused(config: TransformerConfig, dtype: torch.dtype = torch.float64) -> nn.Module:
    return build("fused", config, seed=0).to(dtype).eval()


@pytest.mark.parametrize("norm_first", [False, True], ids=["post", "pre"])
@pytest.mark.parametrize("masked", [True, False], ids=["padded-source", "no-mask"])
def test_the_static_step_equals_the_cached_step_and_the_full_decode_at_every_position(norm_first, masked):
    """float64, padded sources and targets that hold padding after their end (S = 6, T = 9), a
    cache of 12 positions: the slots not yet written must not count."""
    config = small_config(dropout=0.0, norm_first=norm_first)
    model = fused(config)
    src, tgt, src_mask, _ = random_batch(config, 3, 6, 9).inputs()
    src_mask = src_mask if masked else None
    assert (src == PAD).any() and (tgt == PAD).any(), "the batch should hold padding"
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        growing = model.start_cache(memory, src_mask)
        static = model.start_static_cache(memory, src_mask, 12)
        full = model.project(model.decode(tgt, memory, src_mask, decoder_mask(tgt, PAD)))  # (B, T, V)
        for t in range(tgt.shape[1]):
            step = model.project(model.static_step(tgt[:, t : t + 1], torch.tensor(t), static))
            cached = model.project(model.decode_step(tgt[:, t : t + 1], growing))
            torch.testing.assert_close(step, cached, **FLOAT64_TOL)
            torch.testing.assert_close(step[:, 0], full[:, t], **FLOAT64_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_static_greedy_gives_greedy_decodes_tokens(copy_model, dtype):
    """The trained copy model's decodings end with EOS at many lengths; expected: the cached
    ``greedy_decode``."""
    model = copy_model.build("fused", dtype)
    arguments = dict(max_len=10, bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)
    expected = greedy_decode(model, copy_model.src, copy_model.src_mask, **arguments)
    lengths = (expected != copy_model.config.pad_id).sum(dim=1)
    assert (expected == tasks.EOS_ID).any(dim=1).any() and len(lengths.unique()) > 3
    tokens = static_greedy_decode(model, copy_model.src, copy_model.src_mask, **arguments)
    assert torch.equal(tokens, expected)


def test_a_decoder_refills_its_cache_for_the_next_batch(copy_model):
    """Two batches of one shape through one ``StaticGreedy``: each gets its own tokens, from the
    same cache (what a captured step needs), and a batch of another shape gets a new one."""
    model = copy_model.build("fused")
    decode = StaticGreedy(model, max_len=10, bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)
    first, second = copy_model.src[:32], copy_model.src[32:]
    for src in (first, second, first[:5]):
        expected = greedy_decode(model, src, padding_mask(src, PAD), max_len=10,
                                 bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)
        cache = decode.next_token_logp.cache
        assert torch.equal(decode(src, padding_mask(src, PAD)), expected)
        assert (decode.next_token_logp.cache is cache) == (src is second)


class ScriptedCache:
    """A stand-in static cache: it knows its length, and its window is one of the length asked."""

    def __init__(self, length: int) -> None:
        self.length = length

    def window(self, length: int) -> ScriptedCache:
        return ScriptedCache(length)


class ScriptedStatic(ScriptedModel):
    """greedy's scripted stand-in with a static step: at position t, row b predicts
    ``script[b, t]``. Records the ids and positions each step receives."""

    def __init__(self, script: torch.Tensor) -> None:
        super().__init__(script)
        self.steps: list[tuple[list[int], int]] = []
        self.windows: list[int] = []  # the length of the window each step read

    def start_static_cache(self, memory, src_mask, max_len, out=None, beams=1):
        return ScriptedCache(max_len)

    def static_step(self, tgt, position, cache):
        self.steps.append((tgt[:, 0].tolist(), int(position)))
        self.windows.append(cache.length)
        return F.one_hot(self.script[:, int(position)], self.config.tgt_vocab_size).double()[:, None]

    def generator(self, hidden):  # the logits whose log-softmax is ``project``
        return 10.0 * hidden


@pytest.mark.parametrize("from_logits", [True, False], ids=["logits", "log-probs"])
def test_rows_stop_at_eos_and_then_hold_padding(from_logits):
    script = torch.tensor([[4, 4, EOS, 6, 6],
                           [EOS, 5, 5, 5, 5],
                           [7, EOS, 3, 3, 3],
                           [3, 4, 5, EOS, 7]])
    model = ScriptedStatic(script)
    decode = StaticGreedy(model, max_len=8, bos_id=BOS, eos_id=EOS, from_logits=from_logits)
    tokens = decode(torch.ones(4, 3, dtype=torch.long))
    expected = torch.tensor([[BOS, 4, 4, EOS, PAD],
                             [BOS, EOS, PAD, PAD, PAD],
                             [BOS, 7, EOS, PAD, PAD],
                             [BOS, 3, 4, 5, EOS]])
    assert torch.equal(tokens, expected)  # stops once the last row has ended: L = 5 < max_len
    # each step reads the previous column (padding after EOS included) at its own position
    assert model.steps == [(expected[:, t].tolist(), t) for t in range(4)]
    assert model.windows == [1, 2, 3, 4]  # eager: step t reads the t + 1 positions written by then
    assert model.encode_calls == 1 and model.decode_calls == []  # never a whole prefix


def test_max_len_cuts_rows_that_never_end():
    model = ScriptedStatic(torch.tensor([[3, 4, 5, 6, 7, 3], [4, EOS, 5, 5, 5, 5]]))
    src = torch.ones(2, 3, dtype=torch.long)
    tokens = static_greedy_decode(model, src, max_len=4, bos_id=BOS, eos_id=EOS)
    assert torch.equal(tokens, torch.tensor([[BOS, 3, 4, 5], [BOS, 4, EOS, PAD]]))
    assert torch.equal(static_greedy_decode(model, src, max_len=1, bos_id=BOS, eos_id=EOS),
                       torch.tensor([[BOS], [BOS]]))


CONFIG = small_config(dropout=0.0)  # max_seq_len 40, tgt_vocab_size 19, batch 2 below


def started(model: nn.Module, max_len: int = 8):
    src, tgt, src_mask, _ = random_batch(CONFIG, 2, 5, 3).inputs()
    with torch.no_grad():
        memory = model.encode(src, src_mask)
    return memory, src_mask, tgt, model.start_static_cache(memory, src_mask, max_len)


def test_start_refuses_bad_arguments_by_name():
    model = fused(CONFIG)
    memory, src_mask, _, cache = started(model)
    with pytest.raises(ValueError, match=r"max_len must lie in \[1, max_seq_len=40\], got 41"):
        model.start_static_cache(memory, src_mask, 41)
    with pytest.raises(TypeError, match=r"max_len must be an int, got float 8\.0"):
        model.start_static_cache(memory, src_mask, 8.0)
    with pytest.raises(TypeError, match=r"memory has dtype torch\.float32"):
        model.start_static_cache(memory.float(), src_mask, 8)
    with pytest.raises(ValueError, match=r"out holds 2 rows, max_len=8 .* not 2 \(B=2 x beams=1\), 9"):
        model.start_static_cache(memory, src_mask, 9, out=cache)
    with pytest.raises(ValueError, match=r"out holds 2 rows, .* not 6 \(B=2 x beams=3\), 8"):
        model.start_static_cache(memory, src_mask, 8, out=cache, beams=3)
    with pytest.raises(ValueError, match="beams must be at least 1, got 0"):
        model.start_static_cache(memory, src_mask, 8, beams=0)
    with pytest.raises(TypeError, match=r"beams must be an int, got float 2\.0"):
        model.start_static_cache(memory, src_mask, 8, beams=2.0)
    with pytest.raises(TypeError, match="out must be a StaticCache"):
        model.start_static_cache(memory, src_mask, 8, out=model.start_cache(memory, src_mask))
    with pytest.raises(ValueError, match="out was started by another model"):
        fused(CONFIG).start_static_cache(memory, src_mask, 8, out=cache)


def test_a_step_refuses_bad_arguments_by_name():
    model = fused(CONFIG)
    memory, src_mask, tgt, cache = started(model)
    ids, position = tgt[:, :1], torch.tensor(0)
    bad = [
        (dict(position=torch.tensor(0.0)), TypeError, "position must be a 0-d torch.int64 tensor"),
        (dict(position=torch.tensor([0])), TypeError, r"position must be a 0-d .* shape \(1,\)"),
        (dict(position=torch.tensor(8)), ValueError, r"position must lie in \[0, 8\) .* got 8"),
        (dict(tgt=tgt[:, :2]), ValueError, r"tgt must hold one new id per cached row, shape \(B=2, 1\)"),
        (dict(tgt=ids.float()), TypeError, "tgt must be an integer tensor"),
        (dict(tgt=ids + CONFIG.tgt_vocab_size), ValueError, r"tgt ids must lie in \[0, 19\)"),
        (dict(cache=model.start_cache(memory, src_mask)), TypeError, "cache must be a StaticCache"),
        (dict(cache=fused(CONFIG).start_static_cache(memory, src_mask, 8)), ValueError,
         "cache was started by another model"),
    ]
    for changes, error, match in bad:
        arguments = dict(tgt=ids, position=position, cache=cache) | changes
        with pytest.raises(error, match=match):
            model.static_step(**arguments)
    model.float()
    float64_cache = r"cache has dtype torch\.float64 but the model's parameters are torch\.float32"
    with pytest.raises(TypeError, match=float64_cache):
        model.static_step(ids, position, cache)


def test_the_loop_refuses_bad_arguments_by_name():
    with pytest.raises(TypeError, match=r"variants.explicit.model has no static step"):
        StaticGreedy(build("explicit", CONFIG), max_len=8, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match=r"max_len must lie in \[1, max_seq_len=40\]"):
        StaticGreedy(fused(CONFIG), max_len=41, bos_id=BOS, eos_id=EOS)
    with pytest.raises(TypeError, match=r"compile_mode must be a torch\.compile mode or None"):
        StaticGreedy(fused(CONFIG), max_len=8, bos_id=BOS, eos_id=EOS, compile_mode=True)
    with pytest.raises(TypeError, match=r"freezing must be a bool, got str 'yes'"):
        StaticGreedy(fused(CONFIG), max_len=8, bos_id=BOS, eos_id=EOS, compile_mode="default", freezing="yes")
    with pytest.raises(ValueError, match="freezing is a compile option: give a compile_mode too"):
        StaticGreedy(fused(CONFIG), max_len=8, bos_id=BOS, eos_id=EOS, freezing=True)
    decode = StaticGreedy(fused(CONFIG), max_len=8, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match="src_mask must mask source keys only"):
        decode(torch.ones(2, 5, dtype=torch.long), torch.ones(2, 1, 5, 5, dtype=torch.bool))


@pytest.mark.slow
def test_the_compiled_static_step_is_one_graph_with_the_eager_steps_log_probs():
    """torch.compile (inductor, default mode on CPU), float64: every position's log-probs equal
    the eager step's within 1e-10, from one graph compiled once (no shape changed) that reads
    no value on the host (no ``.item()``, which a CUDA graph could not hold)."""
    from torch._dynamo.backends.registry import lookup_backend

    graphs = []

    def recording_inductor(graph_module, example_inputs):
        graphs.append(graph_module)
        return lookup_backend("inductor")(graph_module, example_inputs)

    model = fused(CONFIG)
    src, tgt, src_mask, _ = random_batch(CONFIG, 3, 6, 9).inputs()
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        eager_cache, compiled_cache = (model.start_static_cache(memory, src_mask, 9) for _ in range(2))
        step = torch.compile(lambda *arguments: model.project(model.static_step(*arguments)),
                             backend=recording_inductor, fullgraph=True)
        for t in range(tgt.shape[1]):
            position = torch.tensor(t)
            expected = model.project(model.static_step(tgt[:, t : t + 1], position, eager_cache))
            torch.testing.assert_close(step(tgt[:, t : t + 1], position, compiled_cache), expected,
                                       **FLOAT64_TOL)
    assert len(graphs) == 1
    host_reads = [node for node in graphs[0].graph.nodes if node.target in ("item", "tolist")
                  or "_local_scalar_dense" in str(node.target)]
    assert not host_reads, f"the step reads values on the host: {host_reads}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", [None, "default", "reduce-overhead"])
def test_on_cuda_static_greedy_gives_greedy_decodes_tokens(copy_model, mode):
    model = copy_model.build("fused").cuda()
    src, src_mask = copy_model.src.cuda(), copy_model.src_mask.cuda()
    arguments = dict(max_len=10, bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)
    expected = greedy_decode(model, src, src_mask, **arguments)
    decode = StaticGreedy(model, compile_mode=mode, **arguments)
    for _ in range(3):  # reduce-overhead records its graph on a later call than the first
        assert torch.equal(decode(src, src_mask), expected)


def test_a_cache_refills_in_grad_mode_too(copy_model):
    """Outside no_grad (as a timing script calls it) the refill writes the cross-attention keys
    and values in place: they must be the cache's own tensors, not views of the fused K/V
    product, and the refilled cache must hold the second batch's."""
    model = copy_model.build("fused").eval()
    first, second = copy_model.src[:8], copy_model.src[8:16]
    step = StaticNextToken(model, 6, None)
    step.start(first, padding_mask(first, PAD))
    cache = step.cache
    step.start(second, padding_mask(second, PAD))
    assert step.cache is cache
    fresh = model.start_static_cache(model.encode(second, padding_mask(second, PAD)),
                                     padding_mask(second, PAD), 6)
    for refilled, expected in zip(cache.layers, fresh.layers, strict=True):
        torch.testing.assert_close(refilled.cross_keys, expected.cross_keys, rtol=0, atol=0)
        torch.testing.assert_close(refilled.cross_values, expected.cross_values, rtol=0, atol=0)


class ArgmaxInputs(TorchDispatchMode):
    """Records the input of every argmax dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.argmax.default:
            self.inputs.append(args[0].detach().clone())
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("from_logits", [True, False], ids=["logits", "log-probs"])
def test_the_greedy_argmax_reads_the_generators_logits_or_the_log_probs_as_asked(from_logits):
    """The first step's argmax reads the generator's output before log_softmax (``from_logits``)
    or after it: expected, ``hidden @ W^T + b`` by hand from the canonical generator weights, on
    the uncached decode of BOS. The tokens alone cannot tell the two apart."""
    model = fused(CONFIG)
    src, _, src_mask, _ = random_batch(CONFIG, 2, 5, 3).inputs()
    canonical = export_weights(model)
    with torch.no_grad():
        hidden = model.decode(torch.full((2, 1), BOS), model.encode(src, src_mask), src_mask, None)
    logits = hidden[:, -1] @ canonical["generator.weight"].T + canonical["generator.bias"]  # (B, V)
    expected = logits if from_logits else logits - logits.logsumexp(dim=-1, keepdim=True)
    watch = ArgmaxInputs()
    with watch:
        StaticGreedy(model, max_len=4, bos_id=BOS, eos_id=EOS, from_logits=from_logits)(src, src_mask)
    assert len(watch.inputs) == 3  # one argmax per step
    torch.testing.assert_close(watch.inputs[0], expected, **FLOAT64_TOL)


@pytest.mark.parametrize("freezing", [True, False], ids=["frozen", "not-frozen"])
@pytest.mark.parametrize("decoder", [StaticGreedy, StaticBeam], ids=["greedy", "beam"])
def test_freezing_reaches_inductor_in_every_compiled_step(monkeypatch, decoder, freezing):
    """A spy in torch.compile's place (nothing compiles): every step the decoder compiles is
    given the mode's inductor options, with freezing on exactly when asked."""
    calls = []

    def spy(function, **options):
        calls.append(options)
        return function

    monkeypatch.setattr(torch, "compile", spy)
    decoder(fused(CONFIG), max_len=8, bos_id=BOS, eos_id=EOS, compile_mode="max-autotune", freezing=freezing)
    mode_options = dict(torch._inductor.list_mode_options("max-autotune"))
    assert mode_options and len(calls) == 2  # the log-probs step and the argmax step
    expected = mode_options | ({"freezing": True} if freezing else {})
    assert all(call == {"options": expected} for call in calls), calls


@pytest.mark.parametrize("decode", [greedy_decode, beam_search, static_greedy_decode,
                                    lambda *a, **k: StaticBeam(a[0], **k)(*a[1:])],
                         ids=["greedy_decode", "beam_search", "StaticGreedy", "StaticBeam"])
def test_a_source_mask_on_the_meta_device_is_refused_naming_the_device(decode):
    model = fused(CONFIG)
    src, _, src_mask, _ = random_batch(CONFIG, 2, 5, 3).inputs()
    with pytest.raises(ValueError, match=r"src_mask is on meta but the model is on cpu"):
        decode(model, src, src_mask.to("meta"), max_len=4, bos_id=BOS, eos_id=EOS)
