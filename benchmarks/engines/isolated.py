"""An engine built and called in a process of its own, so that its threads cannot change
how torch's run.

    engine = Isolated(CTranslate2Model, directory, compute_type="int8", threads=2)
    tokens = engine.greedy(src, max_len=65)   # runs in the child; the result comes back
    engine.close()                            # or let it go: the child ends with it

Why: torch loads its OpenMP runtime (libgomp) globally, so CTranslate2's calls into OpenMP land
in the same runtime, from CTranslate2's own worker thread, which starts a second team of
threads. With more OpenMP threads than cores, libgomp stops letting idle threads spin and puts
them to sleep between parallel regions, for torch's team too, for the rest of the process.
Measured on the 2-core VM: beside a CTranslate2 row in the same process, compare.py's onednn
bfloat16 row decoded 839 tokens/s at batch 8, against 1,359 without one
(docs/results/cpu-bf16.md). A child process has a runtime of its own.

The child is a fresh interpreter (``python -m benchmarks.engines.server``, nothing inherited
from this one's threads, and no re-import of the caller's script as ``multiprocessing``'s spawn
would do).
It builds ``factory(*args, **kwargs)``, then serves calls one at a time, pickled over its stdin
and stdout: ``engine.name(*args, **kwargs)`` sends one and waits. A call's time, measured here,
includes that round trip (well under a millisecond beside a decode's hundreds). An exception in
the child comes back as ``RuntimeError`` naming the call and the child's error; a call after the
child has gone (killed, or closed here) is a ``RuntimeError`` too.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import weakref
from collections.abc import Callable
from typing import IO, Any

STOP = None  # what the parent sends to end the child
LIVE: set[int] = set()  # the children's pids while they run
ENDED_CPU_S: list[float] = []  # each ended child's CPU seconds, read as it ended


class Isolated:
    """``factory(*args, **kwargs)`` in a child process of its own; its public methods, called
    here, run there."""

    def __init__(self, factory: Callable[..., object], *args: Any, **kwargs: Any) -> None:
        self.name = getattr(factory, "__name__", repr(factory))
        self.process = subprocess.Popen([sys.executable, "-m", "benchmarks.engines.server"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        LIVE.add(self.process.pid)
        self.closer = weakref.finalize(self, stop, self.process)
        self.send((factory, args, kwargs), "building it")
        self.receive("building it")

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` on the child's object; its result."""
        self.send((method, args, kwargs), f"{method}()")
        return self.receive(f"{method}()")

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_") or method in ("name", "process", "closer"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self.call(method, *args, **kwargs)

    def send(self, message: object, what: str) -> None:
        """``message`` to the child; RuntimeError if it is gone (its pipe broken or closed)."""
        try:
            pickle.dump(message, self.process.stdin)
            self.process.stdin.flush()
        except (OSError, ValueError):  # BrokenPipeError; ValueError: the pipe closed by close()
            status = self.process.poll()
            ended = f"exit status {status}" if status is not None else "its pipe closed"
            raise RuntimeError(f"{self.name} in its own process is gone ({ended}) before {what}") from None

    def receive(self, what: str) -> Any:
        """The child's answer; RuntimeError with its error if it had one, or if it died."""
        try:
            ok, value = pickle.load(self.process.stdout)
        except (EOFError, OSError, ValueError):  # ended, or its pipe closed by close()
            raise RuntimeError(f"{self.name} in its own process ended while {what}") from None
        if not ok:
            raise RuntimeError(f"{self.name} in its own process failed {what}: {value}")
        return value

    def close(self) -> None:
        """End the child (also done when this object is collected, or at exit)."""
        self.closer()


def cpu_seconds(pid: int, proc: str = "/proc") -> float:
    """A process's CPU time, user and system, from ``/proc/PID/stat`` (0 where it cannot be
    read: ended, or no /proc)."""
    try:
        with open(f"{proc}/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()  # state, ppid, ... after the name
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (OSError, IndexError, ValueError):
        return 0.0


def children_cpu_seconds() -> float:
    """The CPU time of every child this process started here, alive or ended: work of the run
    that a reading of the cores (``benchmarks.compare.machine``) must count as its own."""
    return sum(map(cpu_seconds, LIVE)) + sum(ENDED_CPU_S)


def stop(process: subprocess.Popen) -> None:
    """Ask the child to end, then make sure it has; keep what CPU time it used."""
    ENDED_CPU_S.append(cpu_seconds(process.pid))
    LIVE.discard(process.pid)
    try:
        pickle.dump(STOP, process.stdin)
        process.stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    process.stdout.close()


def serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """The child: build the object, answer ``(ok, value)`` to each call until told to stop."""
    def answer(ok: bool, value: object) -> None:
        pickle.dump((ok, value), answers)
        answers.flush()

    factory, args, kwargs = pickle.load(requests)
    try:
        served = factory(*args, **kwargs)
    except Exception as error:
        answer(False, f"{type(error).__name__}: {error}")
        return
    answer(True, None)
    while (request := pickle.load(requests)) is not STOP:
        method, call_args, call_kwargs = request
        try:
            result = getattr(served, method)(*call_args, **call_kwargs)
        except Exception as error:
            answer(False, f"{type(error).__name__}: {error}")
            continue
        answer(True, result)
