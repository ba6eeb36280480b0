"""Whether a device multiplies bfloat16 natively, and how that was told.

    support = bfloat16_support("cpu")
    support.native   # True on a CPU with avx512_bf16 or amx_bf16 (recent AMD EPYC, Intel Xeon)
    support.reason   # "avx512_bf16 in /proc/cpuinfo", said in a run's first line

On a CPU with one of these instruction sets, PyTorch's bfloat16 matrix products run oneDNN's
bfloat16 kernels, at up to 2-3x float32's speed (docs/numerics.md#bfloat16-on-the-cpu). On
another CPU bfloat16 still computes the same values, but each product widens its operands to
float32 first: slower than float32 itself, which a run must say rather than print a slow table.
The CPU's flags are read from Linux's ``/proc/cpuinfo``; where there is none, support cannot be
told and is not assumed. On CUDA, ``torch.cuda.is_bf16_supported`` (compute capability 8.0 and
above: Ampere, Hopper) tells.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of a native bfloat16 product
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class Bfloat16Support:
    """One device's answer."""

    native: bool  # whether the device multiplies bfloat16 in hardware
    reason: str  # how that was told, for a run's first line


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str] | None:
    """The first CPU's flags in ``cpuinfo`` (Linux), or None where the file cannot be read."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    line = next((line for line in text.splitlines() if line.split(":", 1)[0].strip() == "flags"), "")
    return frozenset(line.partition(":")[2].split())


def bfloat16_support(device: str | torch.device = "cpu", cpuinfo: Path = CPUINFO) -> Bfloat16Support:
    """Whether ``device`` ("cpu" or "cuda") multiplies bfloat16 natively; ValueError for another."""
    kind = torch.device(device).type
    if kind == "cuda":
        if not torch.cuda.is_available():
            return Bfloat16Support(False, "no CUDA device")
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return Bfloat16Support(True, "torch.cuda.is_bf16_supported")
        return Bfloat16Support(False, "a CUDA device of compute capability below 8.0: bfloat16 is emulated")
    if kind != "cpu":
        raise ValueError(f"bfloat16_support answers for cpu or cuda, got {device!r}")
    flags = cpu_flags(cpuinfo)
    if flags is None:
        return Bfloat16Support(False, f"cannot read {cpuinfo}: native bfloat16 not assumed")
    found = [flag for flag in CPU_FLAGS if flag in flags]
    if found:
        return Bfloat16Support(True, f"{' and '.join(found)} in {cpuinfo}")
    return Bfloat16Support(False, f"no {' or '.join(CPU_FLAGS)} in {cpuinfo}: bfloat16 is emulated, "
                                  "slower than float32")
