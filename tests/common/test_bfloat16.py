"""Native bfloat16 told from the CPU's flags (a written /proc/cpuinfo, both ways) and from CUDA's
answer (mocked both ways): the verdict never depends on the machine the tests run on."""

from __future__ import annotations

import pytest
import torch

from common.bfloat16 import bfloat16_support, cpu_flags

CPUINFO = """processor\t: 0
vendor_id\t: {vendor}
model name\t: {name}
flags\t\t: fpu vme sse sse2 avx avx2 avx512f {extra}

processor\t: 1
flags\t\t: fpu
"""


def written(tmp_path, extra: str, vendor="AuthenticAMD", name="AMD EPYC"):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO.format(vendor=vendor, name=name, extra=extra))
    return path


@pytest.mark.parametrize(("extra", "named"), [
    ("avx512_bf16 avx512_vnni", "avx512_bf16"),
    ("amx_tile amx_bf16 amx_int8", "amx_bf16"),
    ("avx512_bf16 amx_bf16", "avx512_bf16 and amx_bf16"),
])
def test_a_cpu_with_a_bfloat16_instruction_set_is_native(tmp_path, extra, named):
    support = bfloat16_support("cpu", cpuinfo=written(tmp_path, extra))
    assert support.native
    assert support.reason.startswith(named + " in ")


@pytest.mark.parametrize("extra", ["", "avx512_vnni avx_vnni", "avx512_bf16x"])
def test_a_cpu_without_one_is_emulated_and_says_so(tmp_path, extra):
    support = bfloat16_support("cpu", cpuinfo=written(tmp_path, extra))
    assert not support.native
    assert "emulated" in support.reason and "avx512_bf16" in support.reason


def test_only_the_flags_line_counts_not_a_model_name_that_mentions_a_flag(tmp_path):
    path = written(tmp_path, "", name="Fake CPU with amx_bf16 in its name")
    assert not bfloat16_support("cpu", cpuinfo=path).native
    assert "fpu" in cpu_flags(path) and "amx_bf16" not in cpu_flags(path)


def test_without_cpuinfo_native_support_is_not_assumed(tmp_path):
    support = bfloat16_support("cpu", cpuinfo=tmp_path / "missing")
    assert not support.native and "cannot read" in support.reason
    assert cpu_flags(tmp_path / "missing") is None


@pytest.mark.parametrize(("available", "supported", "native", "said"), [
    (True, True, True, "is_bf16_supported"),
    (True, False, False, "below 8.0"),
    (False, True, False, "no CUDA device"),
])
def test_cuda_asks_torch_without_counting_emulation(monkeypatch, available, supported, native, said):
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: asked.append(including_emulation) or supported)
    support = bfloat16_support("cuda")
    assert support.native is native and said in support.reason
    assert asked in ([], [False])


def test_another_device_is_refused_by_name():
    with pytest.raises(ValueError, match=r"cpu or cuda.*'meta'"):
        bfloat16_support("meta")
