"""``run(settings) -> report``: every variant side by side, block by block, phase by phase.

    report = run(Settings(config, shapes=(Shape(8, 64, 64),), show_progress=False))
    print(render(report, "github"))

Each block (a device, a dtype, a shape) builds a row per variant with the reference's weights,
checks their log-probs against the reference, warms every step up, times the steps in
interleaved rounds beside the matmul peak (each round after re-placing every row's weights in
fresh memory; with ``--resolution``, rounds until every ratio is resolved to it), then measures
each step's peak memory and the bytes of each key/value cache. Deployment engines
(``settings.engines``) join a CPU float32 block as decode-only rows holding the reference's
weights, timed in the same rounds.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from time import perf_counter

import torch
from torch import Tensor
from tqdm import tqdm

from benchmarks.compare.failures import recover, release
from benchmarks.compare.machine import during, read_sample
from benchmarks.compare.measured import Cell, Row
from benchmarks.compare.memory import cache_bytes, keep_freed_memory, model_bytes, profile_step, sdpa_backend
from benchmarks.compare.placement import Placement
from benchmarks.compare.ratios import each_round_order, ratio_widths
from benchmarks.compare.report import add_ratios, block_result, meta, rounds_fields, row_result
from benchmarks.compare.settings import Settings
from benchmarks.compare.steps import (
    DECODE_MODES,
    TORCH_FAST_PATH_OPS,
    Autocast,
    autocast_region,
    compiled,
    decode_steps,
    forward_backward,
    forward_step,
    is_training,
)
from benchmarks.compare.timing import MatmulPeak, Peak, float32_matmul_precision, time_step
from benchmarks.compare.workload import DTYPES, Shape, gemm_shapes, small_shape_warning
from benchmarks.engines.rows import EngineSettings, engine_rows
from common.random_batch import Batch, random_batch
from common.weights import transfer
from variants import REFERENCE, build

# the second, separately built reference row, timed like any other: torch against itself
CONTROL = f"{REFERENCE} control"


@dataclass(frozen=True)
class Block:
    """One block's work: where it runs, in what precision, on which batch."""

    device: str  # "cpu" or "cuda"
    dtype_name: str  # a key of workload.DTYPES
    shape: Shape  # the batch's shape
    batch: Batch  # the padded batch every row runs on
    autocast: Autocast  # the precision region every step runs in

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype of ``dtype_name``."""
        return DTYPES[self.dtype_name]

    @property
    def where(self) -> str:
        """The block as the progress bar and the timers name it."""
        return f"{self.device} {self.dtype_name} B={self.shape.batch} S={self.shape.src_len} " \
               f"T={self.shape.tgt_len}"


def run(settings: Settings, on_phase: Callable[[], None] | None = None,
        on_timed: Callable[[], None] = lambda: None) -> dict:
    """Measure every (device, dtype, shape) block of ``settings``; return the report.
    ``on_phase``, if given, is called as each phase the progress bar counts ends (whether or not
    the bar is shown), and ``on_timed`` once the last block's last round is timed: how a process
    of ``run_processes`` tells its parent."""
    deadline = perf_counter() + settings.max_seconds  # --resolution's cap on adding rounds
    plan = list(itertools.product(settings.devices, settings.dtypes, settings.shapes))
    with configured_process(settings) as allocator, \
            tqdm(total=total_phases(settings), disable=not settings.show_progress, unit="phase",
                 dynamic_ncols=True) as bar:
        if on_phase is not None:
            tell_each_phase(bar, on_phase)
        started = read_sample()  # others' use of the cores across the run, against the one before
        blocks = [run_block(settings, device, dtype_name, shape, bar, deadline,
                            on_timed if index == len(plan) - 1 else lambda: None)
                  for index, (device, dtype_name, shape) in enumerate(plan)]
        cores = during(started, read_sample(), settings.threads)
    return {"meta": meta(settings, allocator, cores), "blocks": blocks}


def tell_each_phase(bar: tqdm, on_phase: Callable[[], None]) -> None:
    """Make ``bar`` call ``on_phase`` for each phase it counts, shown or not (a disabled tqdm
    counts nothing itself)."""
    count = bar.update

    def update(n: float | None = 1) -> bool | None:
        for _ in range(int(n or 0)):
            on_phase()
        return count(n)

    bar.update = update


def total_phases(settings: Settings) -> int:
    """How many phases ``run(settings)`` counts on its progress bar, all blocks together
    (``--resolution``'s further rounds excepted: they are added as they start)."""
    return sum(block_phases(settings, device, dtype_name)
               for device, dtype_name, _ in itertools.product(settings.devices, settings.dtypes,
                                                               settings.shapes))


def block_phases(settings: Settings, device: str, dtype_name: str) -> int:
    """How many phases ``run_block`` counts on the progress bar for one block: the log-prob
    check and the peak memory where they are measured (``measure_shared``), building (with
    compile, compiling) each timed row's steps (the control's too), the engines' export where
    they join, every mode of every round (``--resolution`` adds its further rounds as they
    start)."""
    timed = len(settings.variants) + int(settings.control and REFERENCE in settings.variants)
    exports = int(engines_join(settings, device, dtype_name))
    return 2 * int(settings.measure_shared) + timed + exports + settings.rounds * len(settings.modes)


def engines_join(settings: Settings, device: str, dtype_name: str) -> bool:
    """Whether the engines' decode rows join this block: CPU float32 blocks only (the engines
    run on the CPU here, and their own reduced precision is their int8 row)."""
    return bool(settings.engines) and device == "cpu" and dtype_name == "float32" and not settings.autocast


def run_block(settings: Settings, device: str, dtype_name: str, shape: Shape, bar: tqdm,
              deadline: float = math.inf, on_timed: Callable[[], None] = lambda: None) -> dict:
    """One block, in its phases: build, check, prepare the steps (with compile, compile them),
    time (then ``on_timed``), measure memory, report."""
    batch = random_batch(settings.config, *shape, seed=settings.seed, device=device)
    autocast = autocast_region(device, DTYPES[dtype_name], settings.autocast)
    block = Block(device, dtype_name, shape, batch, autocast)
    rows = build_rows(settings, block)
    timed = [row for row in rows if row.variant in settings.variants or row.variant == CONTROL]
    reference_logp = None
    if settings.measure_shared:
        with phase(bar, f"{block.where}: log-probs against {REFERENCE}"):
            reference_logp = check_log_probs(rows, block)
    for row in timed:
        with phase(bar, f"{block.where}: {row.variant}: "
                        + ("compiling and warming up" if settings.compile else "building its steps")):
            prepare(row, settings, block, reference_logp)
    del reference_logp
    reference = next(row for row in rows if row.variant == REFERENCE)
    with tempfile.TemporaryDirectory(prefix="compare-engines-") as exported:
        engines = build_engine_rows(settings, block, reference, exported, bar)
        peak, rounds = time_rounds(timed + engines, settings, block, bar, deadline)
    on_timed()
    if settings.measure_shared:
        with phase(bar, f"{block.where}: peak memory"):
            measure_memory([row for row in timed if row.variant != CONTROL], block)
    results = [row_result(row, settings, shape, peak and peak.flops_per_second) for row in timed + engines]
    control = next((result for result in results if result["variant"] == CONTROL), None)
    for row in rows:  # free this block's models before the next block
        row.model.to("cpu")
    release(None, device)
    on_cuda = device == "cuda"
    return block_result(device, dtype_name, shape, peak,
                        [result for result in results if result is not control],
                        rounds=rounds, control=control, seed=settings.seed,
                        float32_matmul_precision=float32_matmul_precision(device),
                        small_shape_warning=small_shape_warning(settings.config, shape, block.dtype)
                        if on_cuda else None)


@contextlib.contextmanager
def configured_process(settings: Settings) -> Iterator[str]:
    """Threads, the torch fast path and the allocator as ``settings`` ask, for the whole run;
    yields the allocator's description. Threads and fast path are restored afterwards."""
    allocator = keep_freed_memory() if settings.keep_freed_memory else "glibc default (--malloc default)"
    threads, fast_path = torch.get_num_threads(), torch.backends.mha.get_fastpath_enabled()
    torch.set_num_threads(settings.threads)
    torch.backends.mha.set_fastpath_enabled(settings.torch_fast_path)
    try:
        yield allocator
    finally:
        torch.set_num_threads(threads)
        torch.backends.mha.set_fastpath_enabled(fast_path)


@contextlib.contextmanager
def phase(bar: tqdm, description: str) -> Iterator[None]:
    """Show ``description`` on the progress bar while the phase runs; count it when it ends."""
    bar.set_description_str(description)
    yield
    bar.update()


def build_rows(settings: Settings, block: Block) -> list[Row]:
    """A row per timed variant, plus the reference, plus (``settings.control``) the control, a
    second reference built apart: every model holds the reference's weights."""
    reference = build(REFERENCE, settings.config, seed=settings.seed)
    names = (*settings.variants, *([REFERENCE] if REFERENCE not in settings.variants else []),
             *([CONTROL] if settings.control and REFERENCE in settings.variants else []))
    rows = []
    for name in names:
        model = reference if name == REFERENCE else build(
            REFERENCE if name == CONTROL else name, settings.config)
        if model is not reference:
            transfer(reference, model)
        model.to(device=block.device, dtype=torch.float32 if settings.autocast else block.dtype)
        rows.append(Row(name, model, cells={mode: Cell() for mode in settings.modes}))
    return rows


def build_engine_rows(settings: Settings, block: Block, reference: Row, directory: str,
                      bar: tqdm) -> list[Row]:
    """The deployment engines' rows, warmed up: each exports the reference's weights under
    ``directory`` (before any timing) and times only decoding; where they join the block
    (``engines_join``), else none."""
    if not engines_join(settings, block.device, block.dtype_name):
        return []
    with phase(bar, f"{block.where}: exporting to {', '.join(settings.engines)}"):
        exported = engine_rows(reference.model, block.batch, settings.decode_len, directory,
                               EngineSettings(engines=settings.engines, threads=settings.threads))
    rows = []
    for engine in exported:
        modes = tuple(mode for mode in settings.modes if mode in engine.steps)
        row = Row(engine.label, None, cells={mode: Cell() for mode in modes}, steps=dict(engine.steps))
        first_calls = warm_up(row, modes, block.device)
        count_decoded_ids(row, first_calls)
        if engine.compiles and len(first_calls) == len(modes):
            row.compile_s = sum(call.seconds for call in first_calls.values())
        rows.append(row)
    return rows


def check_log_probs(rows: list[Row], block: Block) -> Tensor | None:
    """Correctness next to speed: each row's eval log-probs against the reference's, which are
    returned (to check compiled forwards too), or None if the reference failed."""
    logps = {}
    for row in rows:
        row.model.eval()
        try:
            logps[row.variant] = forward_step(row.model, block.batch, block.autocast)().float()
        except Exception as error:  # reported in the row; the run goes on
            row.dlogp_error = recover(error, row.model, block.device)
    reference = logps.get(REFERENCE)
    for row in rows:
        if row.variant in logps and reference is not None:
            row.max_abs_dlogp = (logps[row.variant] - reference).abs().max().item()
    return reference


def prepare(row: Row, settings: Settings, block: Block, reference_logp: Tensor | None) -> None:
    """Build the row's steps; with compile, call each once, which compiles it (the results are
    freed on return, before any timing). An eager step is not called here: its first round's
    call, never kept (``time_step``), is its warm-up, and a decoder's calls count the ids it
    produces (``counting_ids``)."""
    row.steps = steps_for(row, settings, block)
    if settings.compile:
        record_compiled(row, warm_up(row, settings.modes, block.device), reference_logp)


@dataclass(frozen=True)
class FirstCall:
    """A step's first call, the warm-up's: what it returned and how long it took."""

    result: object
    seconds: float


def warm_up(row: Row, modes: tuple[str, ...], device: str) -> dict[str, FirstCall]:
    """Call each of the row's steps once, so that timing starts warm (with compile, this is where
    compiling happens); return the first calls by mode. A step that fails marks its cell."""
    first_calls = {}
    for mode in modes:
        if row.model is not None:
            row.model.train(is_training(mode))
        started = perf_counter()
        try:
            result = row.steps[mode]()
            if device == "cuda":
                torch.cuda.synchronize()  # the kernels' time (compiled ones: their autotuning) too
        except Exception as error:
            row.cells[mode].error = recover(error, row.model, device)
            continue
        first_calls[mode] = FirstCall(result, perf_counter() - started)
    return first_calls


def counting_ids(row: Row, mode: str, step: Callable[[], Tensor]) -> Callable[[], Tensor]:
    """``step``, a decoder's call, which also records the target ids (BOS excluded) the call
    produced in ``row.decode_positions[mode]``: decoding is deterministic, so every call
    produces as many."""
    def call() -> Tensor:
        ids = step()  # (B, L)
        row.decode_positions[mode] = ids.shape[0] * (ids.shape[1] - 1)
        return ids
    return call


def count_decoded_ids(row: Row, first_calls: dict[str, FirstCall]) -> None:
    """The target ids (BOS excluded) one call of each decode mode produces, from its first call's
    (B, L) ids: decoding is deterministic, so every timed call produces as many."""
    for mode in DECODE_MODES:
        if mode in first_calls:
            ids = first_calls[mode].result
            row.decode_positions[mode] = ids.shape[0] * (ids.shape[1] - 1)


# the modes whose step runs the compiled model (steps_for); the others run it eagerly
COMPILED_MODES = ("forward", "train")


def record_compiled(row: Row, first_calls: dict[str, FirstCall], reference_logp: Tensor | None) -> None:
    """A compiled row's compile time, the first calls of its compiled steps (compiling and one
    run each; None if one failed), and its compiled forward's log-probs against the reference's."""
    if all(mode in first_calls for mode in COMPILED_MODES):
        row.compile_s = sum(first_calls[mode].seconds for mode in COMPILED_MODES)
    if "forward" in first_calls and reference_logp is not None:
        row.max_abs_dlogp = (first_calls["forward"].result.float() - reference_logp).abs().max().item()


def steps_for(row: Row, settings: Settings, block: Block) -> dict[str, Callable[[], object]]:
    """The row's timed calls by mode; with compile, ``COMPILED_MODES`` run the compiled model and
    their eager steps are kept beside them."""
    model = compiled(row.model, settings.freeze) if settings.compile else row.model
    batch, autocast = block.batch, block.autocast
    decoders = decode_steps(row.model, batch, settings.decode_len, autocast)
    steps = {"forward": forward_step(model, batch, autocast),
             "train": forward_backward(model, batch, autocast),
             **{mode: counting_ids(row, mode, step) for mode, step in decoders.items()}}
    if settings.compile:
        steps |= {"forward_eager": forward_step(row.model, batch, autocast),
                  "train_eager": forward_backward(row.model, batch, autocast)}
    return steps


def time_rounds(timed: list[Row], settings: Settings, block: Block, bar: tqdm,
                deadline: float = math.inf) -> tuple[Peak | None, dict]:
    """Rounds: each row's weights re-placed in fresh memory (``settings.replacing``), the
    matmul peak, then each mode for every row once, the rows in a fresh shuffled order each
    round, so that drift, bursts of other work and where each model's weights lie hit rows at
    random rather than always the same one. ``settings.rounds`` rounds; with
    ``settings.resolution``, more until ``resolution_met`` or until the clock passes ``deadline``.
    Returns the matmul peak (at this model's GEMM shapes and a large square; None where
    ``settings.measure_shared`` is off) and the rounds' record: their orders, and other
    processes' use of the cores in each (cores' worth) with whether it left fewer free cores
    than the run's threads, the seconds each re-placing took (none when not re-placing); with a
    resolution, whether it was met."""
    peak = None
    if settings.measure_shared:
        peak = MatmulPeak(block.device, block.dtype, settings.threads,
                          gemm_shapes(settings.config, block.shape, block.device))
    by_name = {row.variant: row for row in timed}
    placement = Placement(settings.order_seed) if settings.replacing else None
    orders, others, contended, replacing = [], [], [], []
    adaptive = settings.resolution is not None
    met = False
    # each round's order drawn as it starts (the same orders as round_orders'): a run of many
    # rounds starts timing at once, and --resolution's draws as many as it needs
    drawn = each_round_order(list(by_name), None if adaptive else settings.rounds, settings.order_seed)
    for round_index, order in enumerate(drawn):
        if round_index >= settings.rounds:  # --resolution's further rounds: stop, or count one more
            if met or perf_counter() >= deadline:
                break
            bar.total = (bar.total or 0) + len(settings.modes)
            bar.refresh()
        orders.append(order)
        started = read_sample()
        if placement:
            moving = perf_counter()
            placement.replace((by_name[name].model for name in order), block.device)
            replacing.append(perf_counter() - moving)
        if peak:
            peak.measure()
        of = "" if adaptive else f"/{settings.rounds}"
        for mode in settings.modes:
            with phase(bar, f"{block.where}: {mode.replace('_', ' ')}, round {round_index + 1}{of}"):
                for name in order:
                    time_cell(by_name[name], mode, settings, block)
        cores = during(started, read_sample(), settings.threads)
        others.append(cores["others_during"] if cores else None)
        contended.append(cores["contended_during"] if cores else None)
        if adaptive and round_index + 1 >= settings.rounds:
            met = resolution_met(timed, settings)
    record = {"orders": orders, "seed": settings.order_seed, "others": others, "contended": contended,
              "replace_s": replacing}
    if adaptive:
        record["resolution"] = {"target": settings.resolution, "met": met,
                                "max_seconds": settings.max_seconds}
    return peak and peak.peak(), record


def resolution_met(timed: list[Row], settings: Settings) -> bool:
    """Whether every ratio the table prints, and the control's, is resolved to within
    ``settings.resolution`` by the rounds so far (``report.ratio_widths``, the same intervals
    the report will give, from the same seed)."""
    fields = [{"variant": row.variant, **rounds_fields(row, settings.modes)} for row in timed]
    control = next((row for row in fields if row["variant"] == CONTROL), None)
    block = {"rows": [row for row in fields if row is not control], "control": control}
    add_ratios(block, settings.seed)
    return all(width is not None and width <= settings.resolution for width in ratio_widths(block).values())


def time_cell(row: Row, mode: str, settings: Settings, block: Block) -> None:
    """One more timing of ``row``'s ``mode``, unless it has already failed or the row has no
    such step (an engine row's forward)."""
    cell = row.cells.get(mode)
    if cell is None or cell.error:
        return
    if row.model is not None:
        row.model.train(is_training(mode))
    try:
        time_step(cell, row.steps[mode], threads=settings.threads, min_run_time=settings.min_run_time,
                  label=block.where, sub_label=mode, description=row.variant)
    except Exception as error:
        cell.error = recover(error, row.model, block.device)


def measure_memory(timed: list[Row], block: Block) -> None:
    """Each row's weights plus the most its forward and train step hold at once, and its
    key/value cache's bytes; the profiles also show whether nn.Transformer's fused fast path ran
    and which SDPA kernels did.

    The train step is measured from a state without gradients, as a first step would be: with
    the timed steps' gradients alive, its own zero_grad(set_to_none=True) would free them at
    the start, and the new ones would only make up for them, leaving gradients out of the peak.
    """
    for row in timed:
        for mode in ("forward", "train"):
            if row.cells[mode].error:
                continue
            row.model.zero_grad(set_to_none=True)
            row.model.train(mode == "train")
            try:
                peak, ops = profile_step(block.device, row.steps[mode])
            except Exception as error:
                row.cells[mode].error = recover(error, row.model, block.device)
                continue
            row.peak_mb[mode] = (model_bytes(row.model) + peak) / 2**20
            row.sdpa_backends[mode] = sdpa_backend(ops)
            if mode == "forward":
                row.fast_path = bool(ops & TORCH_FAST_PATH_OPS)
        row.model.zero_grad(set_to_none=True)
        if "decode" in row.cells and not row.cells["decode"].error:
            measure_cache(row, block)


def measure_cache(row: Row, block: Block) -> None:
    """The bytes of the row's key/value cache (None without one), in the block's precision."""
    row.model.eval()
    try:
        with block.autocast():
            row.cache_bytes = cache_bytes(row.model, block.batch.src, block.batch.src_mask)
    except Exception as error:
        row.cells["decode"].error = recover(error, row.model, block.device)
