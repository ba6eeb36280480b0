"""Memory: the allocator policy a run measures under, and the peak memory of one step."""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import ctypes.util
import itertools
import os
import platform
import sys
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn
from torch.autograd import DeviceType


def keep_freed_memory() -> str:
    """Make glibc keep freed memory for reuse instead of handing large buffers back to the OS.

    By default glibc serves big allocations with mmap and unmaps them on free, so every step of
    a model whose activations are megabytes page-faults all of them in again (a measurable share
    of a CPU train step: docs/benchmarks.md, Allocator). With mmap off (M_MMAP_MAX=0) and a
    2 GiB trim threshold, freed activations stay in the heap and the next step reuses them; the
    price is a process that holds on to its high-water mark. Returns a description for the
    header.
    """
    if platform.libc_ver()[0] != "glibc":
        return "system malloc, untouched (not glibc)"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    m_trim_threshold, m_mmap_max = -1, -4  # from <malloc.h>
    if libc.mallopt(m_mmap_max, 0) and libc.mallopt(m_trim_threshold, 2**31 - 1):
        return "glibc keeps freed memory (mallopt M_MMAP_MAX=0, M_TRIM_THRESHOLD=2 GiB)"
    return "glibc default (mallopt refused)"


def profile_step(device: str, step: Callable[[], object]) -> tuple[int, set[str]]:
    """The most bytes ``step`` allocates at once above what was live before it, and its ops.

    CUDA: the caching allocator's own peak counter. CPU, which has none: the profiler's
    memory events, each op's own allocations and frees summed at its start (``op_peak``).
    """
    if device == "cuda":
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    with quiet_stderr(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                profile_memory=device == "cpu") as profiler:
        step()
    events = profiler.profiler.kineto_results.events()  # the raw events, not FunctionEvents
    ops = {event.name() for event in events}
    if device == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start, ops
    return op_peak(events), ops


MEMORY_EVENT = "[memory]"  # the profiler's name for an allocation (bytes > 0) or a free (< 0)
# what torch.profiler's FunctionEvents leave out as ops: its own markers and three queries
UTILITY_OPS = frozenset({MEMORY_EVENT, "[OutOfMemory]", "profiler::_record_function_enter",
                         "profiler::_record_function_enter_new", "profiler::_record_function_exit",
                         "aten::is_leaf", "aten::output_nr", "aten::_version"})
HOST_MEMORY = (DeviceType.CPU, DeviceType.MKLDNN, DeviceType.IDEEP)  # the devices whose bytes count


def op_peak(events: Sequence) -> int:
    """The most bytes live at once in a profile's raw events (``kineto_results.events()``):
    each op's own allocations and frees (those inside it and inside none of the ops it calls)
    added at its start, an allocation inside no op at its own time, summed in start order.
    This is ``sum(event.self_cpu_memory_usage)`` over torch.profiler's FunctionEvents in
    start order, computed here without building them (0.1-0.6 s for a small train step's
    thousands of ops; this takes a few milliseconds).

    An op's bytes are those of the memory events that start inside [start, end], its ends
    included, minus its children's; a child is an op of the same thread that starts and ends
    inside it (async ops, which end on another thread, have no children and own nothing)."""
    memory = sorted((event.start_ns(), event.nbytes() if event.device_type() in HOST_MEMORY else 0)
                    for event in events if event.name() == MEMORY_EVENT)
    starts = [start for start, _ in memory]
    totals = list(itertools.accumulate((size for _, size in memory), initial=0))  # totals[i]: first i
    # hidden events are no ops either (a release without is_hidden_event hides none)
    ops = [event for event in events
           if event.name() not in UTILITY_OPS and not getattr(event, "is_hidden_event", lambda: False)()]
    owned, claimed = [], [False] * len(memory)
    for event in ops:
        if event.device_type() != DeviceType.CPU:
            owned.append(0)
            continue
        first = bisect.bisect_left(starts, event.start_ns())
        last = bisect.bisect_right(starts, event.end_ns())
        owned.append(totals[last] - totals[first])
        claimed[first:last] = [True] * (last - first)
    asynchronous = {index for index, event in enumerate(ops)
                    if event.is_async() or event.start_thread_id() != event.end_thread_id()}
    own = [0 if index in asynchronous else size for index, size in enumerate(owned)]  # less children below
    synchronous = [index for index, event in enumerate(ops)
                   if event.device_type() == DeviceType.CPU and index not in asynchronous]
    synchronous.sort(key=lambda index: (ops[index].start_thread_id(), ops[index].start_ns(),
                                        -ops[index].end_ns()))
    stack: list[int] = []  # the open ops of one thread, each inside the one below it
    for index in synchronous:
        event = ops[index]
        while stack and (ops[stack[-1]].start_thread_id() != event.start_thread_id()
                         or event.start_ns() >= ops[stack[-1]].end_ns()
                         or event.end_ns() > ops[stack[-1]].end_ns()):
            stack.pop()
        if stack:
            own[stack[-1]] -= owned[index]
        stack.append(index)
    timeline = [(event.start_ns(), size) for event, size in zip(ops, own, strict=True)]
    timeline += [(start, size) for (start, size), used in zip(memory, claimed, strict=True) if not used]
    current = peak = 0
    for _, size in sorted(timeline, key=lambda entry: entry[0]):
        current += size
        peak = max(peak, current)
    return peak


# scaled_dot_product_attention's kernels as the profiler names them, and what to call them
SDPA_BACKENDS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "mem-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cuDNN",
}


def sdpa_backend(ops: set[str]) -> str | None:
    """Which SDPA kernels a profiled step ran (``profile_step``'s ops), e.g. "flash (CPU)";
    several joined by " + "; None when it never called scaled_dot_product_attention."""
    ran = [name for op, name in SDPA_BACKENDS.items() if op in ops]
    return " + ".join(ran) or None


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence the profiler's start/stop chatter, which its C++ side writes straight to fd 2."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def cache_bytes(model: nn.Module, src: torch.Tensor, src_mask: torch.Tensor, steps: int = 2
                ) -> tuple[float, float] | None:
    """Bytes of the model's key/value cache per source: the cross-attention keys and values,
    held from the start, and what each decoded token adds (measured over ``steps`` steps).
    None for a model without a cache."""
    if not getattr(model, "has_cache", False):
        return None
    with torch.no_grad():
        cache = model.start_cache(model.encode(src, src_mask), src_mask)
        start = cache.nbytes()
        for _ in range(steps):
            model.decode_step(torch.ones_like(src[:, :1]), cache)
    sources = src.shape[0]
    return start / sources, (cache.nbytes() - start) / (sources * steps)


def model_bytes(model: nn.Module) -> int:
    """The bytes of the model's own parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
