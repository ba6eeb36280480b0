"""What compare.py's numbers mean, checked against what they should be: the matmul peak is the
best of the model's own GEMM shapes, the train step's peak memory counts weights, gradients and
activations, the compile time is the compiled steps' first calls, and the SDPA kernel and CUDA
notes are named."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from torch.autograd import DeviceType

import benchmarks.compare.run
from benchmarks.compare import timing
from benchmarks.compare.measured import Cell, Row
from benchmarks.compare.memory import op_peak, profile_step, sdpa_backend
from benchmarks.compare.render import header_lines, notes
from benchmarks.compare.run import Block, count_decoded_ids, measure_memory, record_compiled, run, warm_up
from benchmarks.compare.settings import Settings
from benchmarks.compare.steps import forward_backward, forward_step
from benchmarks.compare.timing import MatmulPeak, time_step
from benchmarks.compare.workload import TIMING_PRESETS, Shape, gemm_shapes
from common.config import TransformerConfig
from common.random_batch import random_batch
from variants import build

TINY = TransformerConfig(**TIMING_PRESETS["tiny"].fields)


def test_the_peak_candidates_are_the_models_gemms_and_one_large_square():
    base = TransformerConfig()  # D 512, F 2048, V 37000
    assert gemm_shapes(base, Shape(8, 128, 64), "cpu") == [
        (1024, 512, 512), (1024, 512, 2048), (1024, 2048, 512), (512, 512, 37000), (2048, 2048, 2048)]
    assert gemm_shapes(base, Shape(8, 128, 128), "cuda")[-1] == (8192, 8192, 8192)


def test_the_peak_is_the_best_shape_with_its_rounds_and_spread():
    shapes = [(8, 8, 8), (128, 128, 128)]
    peak = MatmulPeak("cpu", torch.float32, 1, shapes)
    for _ in range(3):
        peak.measure()
    result = peak.peak()
    assert set(result.by_shape) == set(shapes)
    assert result.flops_per_second == max(result.by_shape.values()) == result.by_shape[result.shape]
    assert result.shape == (128, 128, 128)  # an 8 x 8 x 8 matmul is all overhead
    assert len(result.rounds) == 3 and all(r > 0 for r in result.rounds)
    assert result.iqr_flops_per_second >= 0


def events_peak(profiler: torch.profiler.profile) -> int:
    """The peak as torch.profiler's own FunctionEvents give it: each op's
    ``self_cpu_memory_usage`` summed in start order (an independent attribution of the bytes)."""
    current = peak = 0
    for event in sorted(profiler.events(), key=lambda e: e.time_range.start):
        current += event.self_cpu_memory_usage
        peak = max(peak, current)
    return peak


def profiled(step) -> torch.profiler.profile:
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu, profile_memory=True) as profiler:
        step()
    return profiler


@pytest.mark.parametrize("name", ["explicit", "mathfirst", "torch"])
@pytest.mark.parametrize("mode", ["forward", "train"])
def test_the_peak_from_the_raw_events_is_the_function_events_peak(name, mode):
    """Thousands of ops nested by the profiler, a backward among them: the same bytes, byte for
    byte, as the FunctionEvents' attribution."""
    model = build(name, TINY, seed=0).train(mode == "train")
    batch = random_batch(TINY, 2, 8, 6, seed=0)
    step = (forward_step if mode == "forward" else forward_backward)(model, batch)
    step()
    model.zero_grad(set_to_none=True)
    profiler = profiled(step)
    assert op_peak(profiler.profiler.kineto_results.events()) == events_peak(profiler) > 0


def test_the_peak_of_nested_ranges_that_free_inside_themselves_is_the_function_events_peak():
    """record_function ranges around ops that allocate, a range that frees what its child op
    allocated (its own bytes then negative, added at its start), and tensors freed outside
    every range: the FunctionEvents' attribution, byte for byte."""
    def step() -> None:
        held = []
        with torch.profiler.record_function("outer"):
            held.append(torch.ones(1000))  # the outer range's own 4,000 bytes
            with torch.profiler.record_function("inner"):
                scratch = torch.ones(5000)  # 20,000 bytes, freed inside the range
                held.append(scratch[:10].clone())
                del scratch
            held.append(torch.zeros(2000))
        held.clear()

    profiler = profiled(step)
    found = op_peak(profiler.profiler.kineto_results.events())
    assert found == events_peak(profiler) > 0


@dataclasses.dataclass
class Event:
    """A raw profiler event as ``op_peak`` reads it: an op over [start, end] ns, or with
    ``size`` a memory event at ``start`` (bytes allocated, or freed if negative)."""

    start: int
    end: int | None = None
    size: int | None = None
    thread: int = 1

    def name(self) -> str:
        return "[memory]" if self.size is not None else "aten::op"

    def start_ns(self) -> int:
        return self.start

    def end_ns(self) -> int:
        return self.start if self.end is None else self.end

    def nbytes(self) -> int:
        return self.size or 0

    def device_type(self) -> DeviceType:
        return DeviceType.CPU

    def start_thread_id(self) -> int:
        return self.thread

    def end_thread_id(self) -> int:
        return self.thread

    def is_async(self) -> bool:
        return False

    def is_hidden_event(self) -> bool:
        return False


def test_bytes_at_an_ops_last_nanosecond_are_its_own_counted_at_its_start():
    """300 bytes live before; op A [0, 10] holds child C [3, 6], which frees them, and
    allocates 100 bytes at its very end (t = 10). Counted at A's start the 100 come before C's
    free: 300, then 400 at A's start, then 100 at C's. Left to their own time the peak would
    be 300."""
    events = [Event(-5, size=300), Event(0, 10), Event(3, 6), Event(4, size=-300), Event(10, size=100)]
    assert op_peak(events) == 400


def test_an_op_that_overlaps_another_only_partly_is_not_its_child():
    """P [0, 10] and E [5, 15] on one thread overlap but neither holds the other: each owns the
    bytes that start inside it (the 100 at t = 7 in both), so P adds 100 at 0 and E 150 at 5.
    Taken as P's child, E would leave P -50 and the peak 100."""
    events = [Event(0, 10), Event(5, 15), Event(7, size=100), Event(12, size=50)]
    assert op_peak(events) == 250


BATCH = Shape(2, 8, 6)


def lower_bound(config: TransformerConfig, shape: Shape) -> int:
    """Bytes a float32 train step must hold at its end, from the model alone: its weights, a
    gradient for each, and the (B, T, V) log-probs, alive until the backward ends."""
    weights = sum(p.numel() * p.element_size() for p in build("explicit", config).parameters())
    return 2 * weights + shape.batch * shape.tgt_len * config.tgt_vocab_size * 4


@pytest.mark.slow  # profiles a train step of every row (about 3 s)
def test_the_train_peak_counts_weights_gradients_and_the_logits():
    settings = Settings(config=TINY, shapes=(BATCH,), preset="tiny", variants=("explicit",), rounds=1,
                        min_run_time=0.01, decode_len=1, threads=1, keep_freed_memory=False,
                        show_progress=False)
    (row,) = run(settings)["blocks"][0]["rows"]
    assert row["train_peak_mb"] * 2**20 >= lower_bound(TINY, BATCH)


def test_the_train_peak_is_measured_from_a_state_without_gradients():
    """Gradients alive from an earlier step would be freed by the measured step's own
    zero_grad(set_to_none=True) and cancel the new ones (on CUDA always; on CPU when the
    profiler saw them made, as here), leaving the gradients out of the peak."""
    model = build("explicit", TINY, seed=0)
    batch = random_batch(TINY, *BATCH, seed=0)
    row = Row("explicit", model, cells={"forward": Cell(), "train": Cell()},
              steps={"forward": forward_step(model, batch), "train": forward_backward(model, batch)})
    model.train()
    profile_step("cpu", row.steps["train"])  # an earlier step: its gradients stay alive
    assert all(p.grad is not None for p in model.parameters())
    measure_memory([row], Block("cpu", "float32", BATCH, batch, contextlib.nullcontext))
    assert row.peak_mb["train"] * 2**20 >= lower_bound(TINY, BATCH)


class Clock:
    """A clock that only the fake steps advance, so the warm-up's timings are exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def step(self, seconds: float, result: object = None, error: Exception | None = None):
        """A step that takes ``seconds`` of this clock, then returns ``result`` or raises ``error``."""

        def call() -> object:
            self.now += seconds
            if error is not None:
                raise error
            return result

        return call


# out of the order Settings.modes gives: the compile time must not depend on it
WARM_UP_ORDER = ("decode", "forward", "beam", "train", "forward_eager", "train_eager")


def warmed_row(monkeypatch, train_error: Exception | None = None) -> Row:
    """A row whose compiled forward takes 2 s and compiled train step 3 s at their first calls;
    its decoders and eager steps, which compile nothing, take far longer."""
    clock = Clock()
    monkeypatch.setattr(benchmarks.compare.run, "perf_counter", clock)
    ids = torch.ones(3, 5, dtype=torch.long)  # (B, L): 3 rows of BOS and 4 decoded ids
    beam_ids = torch.ones(3, 3, dtype=torch.long)  # a beam that stopped early: 2 ids past BOS
    row = Row("explicit", torch.nn.Linear(2, 2), cells={mode: Cell() for mode in WARM_UP_ORDER})
    row.steps = {"decode": clock.step(100.0, ids), "forward": clock.step(2.0, torch.zeros(3, 4, 7)),
                 "beam": clock.step(300.0, beam_ids), "train": clock.step(3.0, error=train_error),
                 "forward_eager": clock.step(50.0), "train_eager": clock.step(70.0)}
    first_calls = warm_up(row, WARM_UP_ORDER, "cpu")
    count_decoded_ids(row, first_calls)
    record_compiled(row, first_calls, reference_logp=torch.full((3, 4, 7), -0.5))
    return row


def test_compile_time_is_the_compiled_steps_first_calls_in_any_order(monkeypatch):
    row = warmed_row(monkeypatch)
    assert row.compile_s == 2.0 + 3.0  # not the decoders' or the eager steps' time
    assert row.decode_positions == {"decode": 3 * 4, "beam": 3 * 2}
    assert row.max_abs_dlogp == 0.5  # the compiled forward's zeros against the reference's -0.5
    assert not any(cell.error for cell in row.cells.values())


def test_a_compiled_step_that_fails_leaves_no_compile_time_and_marks_its_cell(monkeypatch):
    row = warmed_row(monkeypatch, train_error=ValueError("no graph"))
    assert row.compile_s is None
    assert row.cells["train"].error == "ValueError: no graph"
    assert row.max_abs_dlogp == 0.5  # the forward still compiled and is still checked


@pytest.mark.parametrize("ops, named", [
    ({"aten::linear", "aten::_scaled_dot_product_flash_attention_for_cpu"}, "flash (CPU)"),
    ({"aten::_scaled_dot_product_attention_math"}, "math"),
    ({"aten::_scaled_dot_product_flash_attention"}, "flash"),
    ({"aten::_scaled_dot_product_efficient_attention"}, "mem-efficient"),
    ({"aten::_scaled_dot_product_cudnn_attention"}, "cuDNN"),
    ({"aten::_scaled_dot_product_attention_math", "aten::_scaled_dot_product_efficient_attention"},
     "math + mem-efficient"),
    ({"aten::scaled_dot_product_attention"}, None),  # the dispatcher alone names no kernel
    ({"aten::bmm", "aten::softmax"}, None),
])
def test_the_sdpa_kernel_is_named_from_the_profiled_ops(ops, named):
    assert sdpa_backend(ops) == named


META = {"cpu_model": "cpu", "gpu_model": "NVIDIA H200", "threads": 1, "torch": "x", "autocast": False,
        "compile": False, "freeze": False, "preset": "tiny", "decode_len": 1, "allocator": "glibc"}


def cuda_block(dtype: str, warning: str | None) -> dict:
    return {"device": "cuda", "dtype": dtype, "batch": 4, "src_len": 16, "tgt_len": 16,
            "matmul_peak_gflops": 1e5, "matmul_peak_iqr_gflops": 1e3, "rows": [],
            "float32_matmul_precision": "TF32", "small_shape_warning": warning}


def test_the_cuda_header_names_the_float32_matmul_precision():
    machine, work = header_lines(META, cuda_block("float32", None))
    assert machine.startswith("cuda: NVIDIA H200")
    assert work.startswith("float32 (matmuls in TF32)") and "(IQR 1,000)" in work
    assert "TF32" not in header_lines(META, cuda_block("bfloat16", None))[1]  # not a float32 matmul
    cpu = {**cuda_block("float32", None), "device": "cpu", "float32_matmul_precision": "IEEE float32"}
    assert "matmuls in" not in header_lines(META, cpu)[1]


def test_a_small_cuda_shape_is_warned_under_the_table():
    assert "warning: too small" in notes(META, cuda_block("bfloat16", "too small"))
    assert not any(line.startswith("warning") for line in notes(META, cuda_block("bfloat16", None)))


def test_a_cell_times_the_same_block_of_calls_every_round_after_one_untimed_call():
    """Every round makes one call it does not keep (the first round sizes the block from it),
    then times the same number of calls as one block (structure only: no time is asserted)."""
    invoked = []
    cell = Cell()
    for _ in range(3):
        time_step(cell, lambda: invoked.append(1), threads=1, min_run_time=0.001)
    assert cell.number is not None and cell.number >= 1
    assert len(cell.rounds) == 3 and all(seconds > 0 for seconds in cell.rounds)
    assert cell.calls == 3 * cell.number  # the timed calls only
    assert len(invoked) == 3 * cell.number + 3  # and one a round not kept


def test_a_step_longer_than_the_warm_call_limit_skips_it_after_the_first_round(monkeypatch):
    monkeypatch.setattr(timing, "WARM_CALL_BELOW", 0.0)  # every step counts as long here
    invoked = []
    cell = Cell()
    for _ in range(3):
        time_step(cell, lambda: invoked.append(1), threads=1, min_run_time=0.001)
    assert len(invoked) == 3 * cell.number + 1  # only the first round's call sized the block


@pytest.mark.parametrize("compile_", [False, True])
def test_only_the_first_calls_that_tell_something_are_made_before_the_rounds(monkeypatch, compile_):
    """Eager, no step is called before the rounds: each is first called in the first round
    (by the call time_step never keeps). Compiled, every step once before (that is its
    compiling)."""
    made = []
    monkeypatch.setattr(benchmarks.compare.run, "warm_up",
                        lambda row, modes, device: made.append(modes) or {})
    config = TransformerConfig(**TIMING_PRESETS["tiny"].fields)
    settings = Settings(config=config, shapes=(Shape(2, 8, 6),), decode_len=4, compile=compile_,
                        all_decoders=True, show_progress=False)
    model = build("explicit", config, seed=0)
    row = Row("explicit", model, cells={mode: Cell() for mode in settings.modes})
    batch = random_batch(config, 2, 8, 6, seed=0)
    block = Block("cpu", "float32", Shape(2, 8, 6), batch, contextlib.nullcontext)
    benchmarks.compare.run.prepare(row, settings, block, reference_logp=None)
    assert made == ([settings.modes] if compile_ else [])
    assert row.decode_positions == {}  # counted by the decoders' own calls (counting_ids)


def test_a_decoders_calls_count_the_ids_it_produces():
    """The ids past BOS of every row, recorded by each call of the decode step itself (its first
    is the first round's call not kept)."""
    row = Row("explicit", torch.nn.Linear(2, 2), cells={"decode": Cell(), "beam": Cell()})
    greedy = benchmarks.compare.run.counting_ids(row, "decode", lambda: torch.ones(3, 5, dtype=torch.long))
    beam = benchmarks.compare.run.counting_ids(row, "beam", lambda: torch.ones(3, 2, dtype=torch.long))
    assert row.decode_positions == {}
    assert greedy().shape == (3, 5)  # the step's ids, handed through
    assert row.decode_positions == {"decode": 3 * 4}
    beam()
    assert row.decode_positions == {"decode": 3 * 4, "beam": 3 * 1}
