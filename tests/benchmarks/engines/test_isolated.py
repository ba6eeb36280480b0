"""benchmarks.engines.isolated: an object built and called in a child process of its own, which is how
compare.py keeps CTranslate2's OpenMP threads out of the process that times torch's rows."""

from __future__ import annotations

import os
import threading
import time

import pytest

from benchmarks.compare.machine import read_sample
from benchmarks.engines.isolated import LIVE, Isolated, cpu_seconds


class Served:
    """What the child builds: it says where it runs, echoes, and fails on demand."""

    def __init__(self, greeting: str, fail: bool = False) -> None:
        if fail:
            raise ValueError("asked to fail while built")
        self.greeting = greeting

    def where(self) -> int:
        return os.getpid()

    def echo(self, value: object, *, twice: bool = False) -> object:
        return (self.greeting, value, value) if twice else (self.greeting, value)

    def fail(self) -> None:
        raise KeyError("asked to fail")

    def spin(self, seconds: float) -> None:
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass


@pytest.mark.slow  # seconds: a child process, a compile or a full run; CI runs it with -m slow
def test_calls_run_in_another_process_and_their_results_come_back():
    served = Isolated(Served, "hello")
    try:
        assert served.where() != os.getpid()
        assert served.echo([1, 2.5, "x"]) == ("hello", [1, 2.5, "x"])
        assert served.call("echo", 3, twice=True) == ("hello", 3, 3)
    finally:
        served.close()
    assert served.process.poll() is not None  # closed: the child has ended


@pytest.mark.slow  # seconds: a child process, a compile or a full run; CI runs it with -m slow
def test_errors_come_back_named_and_the_child_serves_on():
    with pytest.raises(RuntimeError, match=r"Served in its own process failed building it: ValueError"):
        Isolated(Served, "hello", fail=True)
    served = Isolated(Served, "hello")
    try:
        with pytest.raises(RuntimeError, match=r"failed fail\(\): KeyError: 'asked to fail'"):
            served.fail()
        assert served.echo(1) == ("hello", 1)
    finally:
        served.close()


@pytest.mark.slow  # seconds: a child process, a compile or a full run; CI runs it with -m slow
def test_a_call_after_the_child_is_gone_is_the_promised_runtime_error():
    """Killed (its pipe broken: was a BrokenPipeError) or closed here (was a ValueError on the
    closed pipe): a RuntimeError naming the engine and the call."""
    served = Isolated(Served, "hello")
    served.process.kill()
    served.process.wait()
    with pytest.raises(RuntimeError, match=r"Served in its own process is gone \(exit status -9\) before "):
        served.echo("x")
    served.close()
    closed = Isolated(Served, "hello")
    closed.close()
    with pytest.raises(RuntimeError, match=r"Served in its own process is gone .* before where\(\)"):
        closed.where()


@pytest.mark.slow  # a child spun for CPU time; the calls' round trip is proved by default
def test_a_child_s_cpu_time_is_read_as_this_run_s_own():
    """The cores' reading counts a child's CPU time as this process's, while it lives and after
    it has ended (so its work is not taken for another program's)."""
    before = read_sample().own_cpu_s - time.process_time()
    served = Isolated(Served, "hello")
    try:
        assert served.process.pid in LIVE
        served.spin(0.3)
        assert read_sample().own_cpu_s - time.process_time() - before >= 0.25
    finally:
        served.close()
    assert served.process.pid not in LIVE
    assert read_sample().own_cpu_s - time.process_time() - before >= 0.25  # ended, still the run's


def test_a_process_cpu_time_is_read_from_its_stat(tmp_path):
    """A made-up /proc entry with 150 user and 50 system ticks (and a name with a space and a
    parenthesis, which the reading skips); an entry that is not there reads 0."""
    fields = ["S", "1"] + ["0"] * 9 + ["150", "50"] + ["0"] * 10
    (tmp_path / "101").mkdir()
    (tmp_path / "101" / "stat").write_text("101 (py (thon) " + " ".join(fields))
    assert cpu_seconds(101, str(tmp_path)) == pytest.approx(200 / os.sysconf("SC_CLK_TCK"))
    assert cpu_seconds(102, str(tmp_path)) == 0.0


@pytest.mark.slow  # another child; the calls' round trip is proved by default
def test_private_names_are_not_sent():
    served = Isolated(Served, "hello")
    try:
        with pytest.raises(AttributeError):
            served._private  # noqa: B018
    finally:
        served.close()


ctranslate = pytest.importorskip("seq2seq.deploy.ctranslate", reason="the deploy extra")


@pytest.mark.slow  # a CTranslate2 child; the calls' round trip is proved by default
def test_an_isolated_ctranslate2_leaves_this_process_threads_as_they_were(tmp_path):
    """CTranslate2 built and run in this process starts threads of its own here (its OpenMP
    team: what slows torch's rows afterwards); isolated, it starts none."""
    import torch

    from common.config import TransformerConfig
    from variants import build

    config = TransformerConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, src_vocab_size=20,
                               tgt_vocab_size=20, max_seq_len=16)
    directory = ctranslate.export_ctranslate2(build("fused", config, seed=0), tmp_path / "ct2",
                                              bos_id=1, eos_id=2)
    src = torch.randint(3, 20, (2, 5))
    before = threading.active_count(), len(os.listdir("/proc/self/task"))
    isolated = Isolated(ctranslate.CTranslate2Model, directory, threads=2)
    try:
        isolated_tokens = isolated.greedy(src, max_len=6)
        assert (threading.active_count(), len(os.listdir("/proc/self/task"))) == before
    finally:
        isolated.close()
    here = ctranslate.CTranslate2Model(directory, threads=2)
    assert torch.equal(here.greedy(src, max_len=6), isolated_tokens)
    assert len(os.listdir("/proc/self/task")) > before[1]  # what isolation keeps out
