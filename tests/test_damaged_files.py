"""Every command that takes a path, fed damaged files: each is one line naming the file and an
exit status of 1 or 2, never a traceback, never 0.

The commands are found in the code (every ``__main__.py`` and every module that runs itself,
under the project's packages, and compare.py), so a new command cannot escape: it must have
its file arguments in ``CASES`` or be declared in ``FILELESS`` (no path a user gives). Each
command runs in this process through its ``main(argv)`` (a ``SystemExit`` caught), with a
damaged file in place of one argument and, where the command needs them, good ones beside it.

The damages, generated here: for a file read — missing, empty, a directory, truncated (the first
half of a good one), random bytes, valid JSON of the wrong shape, text that is not UTF-8; for a
file or folder written — a directory in a file's place (a file in a folder's), and a path under
a regular file.
"""

from __future__ import annotations

import importlib
import io
import json
import random
import sys
import traceback
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.test_layering import is_program

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "variants", "seq2seq", "benchmarks", "scripts")

# commands with no file a user names: what they read or write instead
FILELESS = {
    "benchmarks.compare.processes": "a worker of compare.py: pickled settings on stdin from run_processes",
    "benchmarks.engines.server": "a worker of benchmarks.engines.isolated: pickled calls on stdin",
    "benchmarks.studies.compile_masks": "times a preset's model; no path option",
    "benchmarks.studies.decode_scan": "times a preset's model; no path option",
    "benchmarks.studies.gemm_paths": "times matrix products; no path option",
    "benchmarks.studies.low_precision": "measures random models; no path option",
    "benchmarks.studies.static_decode": "times a preset's model; no path option",
    "scripts.architecture": "writes docs/architecture.svg from the source tree; no path option",
    "scripts.checkpoint_deviations": "builds its own tiny checkpoints; no path option",
    "scripts.concept_map": "reads the README and the source tree it belongs to; no path option",
    "scripts.layout": "reads the packages' indexes, writes docs/architecture.md's tree; no path option",
    "scripts.deviations": "prints a table of built models; no path option",
    "scripts.side_by_side": "writes docs/ pages from the source tree; no path option",
    "scripts.trace": "prints a built model's modules; no path option",
    "variants.check": "SPEC names a module (package.module:Class), imported, not a file read",
}

READ = ("missing", "empty", "a directory", "truncated", "random bytes", "JSON of the wrong shape",
        "not UTF-8")
WRITE = ("a directory in its place", "under a regular file")
FOLDER_WRITE = ("a file in its place", "under a regular file")


def program_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__main__" else parts)


def programs() -> set[str]:
    """The dotted names of every command in the project (compare.py as ``compare``)."""
    found = {"compare"} if is_program(ROOT / "compare.py") else set()
    for package in PACKAGES:
        found |= {program_name(path) for path in (ROOT / package).rglob("*.py") if is_program(path)}
    return found


# --- the damaged files -------------------------------------------------------------------------


def good_bytes(kind: str) -> bytes:
    """A good file of ``kind``, whose first half is the truncated damage."""
    if kind == "json":
        return json.dumps({"meta": {"contended": False}, "blocks": [{"rows": []}]}).encode()
    if kind == "corpus":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr("fra.txt", "Go.\tVa !\tCC-BY 2.0\n" * 20)
        return buffer.getvalue()
    buffer = io.BytesIO()  # a model file or checkpoint: a torch archive
    torch.save({"format": "weights", "tensor": torch.zeros(64)}, buffer)
    return buffer.getvalue()


def damaged(tmp_path: Path, damage: str, kind: str, name: str) -> Path:
    """``tmp_path/name`` made into ``damage`` (of a file of ``kind``, for the truncated one)."""
    path = tmp_path / name
    if damage == "missing":
        return path
    if damage in ("a directory", "a directory in its place"):
        path.mkdir()
        return path
    if damage in ("under a regular file",):
        blocker = tmp_path / "damaged-blocker"
        blocker.write_text("a file, not a folder\n", encoding="utf-8")
        return blocker / name
    data = {"empty": b"",
            "truncated": good_bytes(kind)[: len(good_bytes(kind)) // 2],
            "random bytes": random.Random(0).randbytes(512),
            "JSON of the wrong shape": b'[1, 2, {"three": null}]',
            "not UTF-8": "Go.\tVa !\nC'est l\u00e0.\t\u00c7a\n".encode("latin-1"),
            "a file in its place": b"a file where a folder goes\n"}[damage]
    path.write_bytes(data)
    return path


@dataclass(frozen=True)
class Case:
    """One file argument of one command: how to run it with ``path`` in that argument's place."""

    program: str
    argument: str  # the option (or positional) that names the file
    damages: tuple[str, ...]
    argv: Callable[[Path, Path], list[str]]  # (the damaged path, a folder of good files) -> argv
    kind: str = "model"  # what the file should be: json, corpus or model (a torch archive)
    name: str = "damaged-file.pt"  # the damaged file's name (inside a folder for a folder argument)
    inside: str | None = None  # the argument names this folder, the damaged file lies in it


def good_report(folder: Path) -> Path:
    """A compare.py report the coverage study reads (two runs of it)."""
    from tests.benchmarks.studies.test_coverage import RUNS
    path = folder / "good-runs.json"
    path.write_text(json.dumps(RUNS), encoding="utf-8")
    return path


def some_file(folder: Path) -> Path:
    """A readable file that is not read before the damaged output is refused."""
    path = folder / "some-model.pt"
    path.write_bytes(b"read only after the output is checked")
    return path


def good_corpus(folder: Path) -> Path:
    path = folder / "good-fra.txt"
    path.write_text("".join(f"Go {i}.\tVa {i} !\n" for i in range(40)), encoding="utf-8")
    return path


TINY_TRAIN = ["--vocab", "40", "--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "16",
              "--steps", "2", "--batch-tokens", "400"]
CASES = [
    Case("compare", "--output", WRITE, lambda p, g: ["--preset", "tiny", "--output", str(p)], name="t.csv"),
    Case("compare", "--plot", WRITE, lambda p, g: ["--preset", "tiny", "--plot", str(p)], name="t.png"),
    Case("benchmarks.studies.coverage", "RUNS", READ, lambda p, g: [str(p), str(good_report(g))],
         kind="json", name="damaged-runs.json"),
    Case("benchmarks.studies.coverage", "--reference", READ,
         lambda p, g: [str(good_report(g)), "--reference", str(p)], kind="json", name="damaged-ref.json"),
    Case("benchmarks.studies.bfloat16_decoding", "MODEL", READ, lambda p, g: [str(p)]),
    Case("benchmarks.studies.bfloat16_decoding", "--output", WRITE,
         lambda p, g: [str(g / "model.pt"), "--output", str(p)], name="results.json"),
    Case("benchmarks.studies.learners", "--data", READ,
         lambda p, g: ["--data", str(p), "--out", str(g / "out"), "--steps", "1"], kind="corpus",
         name="damaged-fra.zip"),
    Case("benchmarks.studies.learners", "--out", FOLDER_WRITE,
         lambda p, g: ["--data", str(good_corpus(g)), "--out", str(p), "--steps", "1"], name="damaged-out"),
    Case("benchmarks.studies.time_breakdown", "--out", WRITE,
         lambda p, g: ["--preset", "tiny", "--out", str(p)], name="damaged.png"),
    Case("seq2seq.translate", "MODEL", READ, lambda p, g: [str(p), "Hello."]),
    Case("seq2seq.decode", "--model", READ, lambda p, g: ["--model", str(p)]),
    Case("seq2seq.average", "--checkpoint-dir", READ,
         lambda p, g: ["--checkpoint-dir", str(p.parent), "--last", "1", "--output", str(g / "avg.pt")],
         name="step-00000001.pt", inside="run"),
    Case("seq2seq.average", "--output", WRITE,
         lambda p, g: ["--checkpoint-dir", str(g), "--last", "1", "--output", str(p)], name="avg.pt"),
    Case("seq2seq.train", "--data", READ,
         lambda p, g: ["--task", "translate", "--data", str(p), *TINY_TRAIN], kind="corpus",
         name="damaged-fra.zip"),
    Case("seq2seq.train", "--checkpoint-dir --resume", READ,
         lambda p, g: ["--task", "copy", "--steps", "2", "--checkpoint-dir", str(p.parent), "--resume"],
         name="step-00000001.pt", inside="run"),
    Case("seq2seq.train", "--checkpoint-dir", FOLDER_WRITE,
         lambda p, g: ["--task", "copy", "--steps", "2", "--checkpoint-dir", str(p)], name="damaged-run"),
    Case("seq2seq.convert", "MODEL", READ, lambda p, g: [str(p.parent), "--output", str(g / "out.pt")],
         kind="json", name="config.json", inside="hf-folder"),
    Case("seq2seq.convert", "--output", WRITE,
         lambda p, g: [str(g / "no-such-folder"), "--output", str(p)], name="out.pt"),
    Case("seq2seq.export_hf", "MODEL", READ, lambda p, g: [str(p), "--output", str(g / "hf")]),
    Case("seq2seq.export_hf", "--output", FOLDER_WRITE,
         lambda p, g: [str(some_file(g)), "--output", str(p)], name="damaged-hf"),
    *(Case("benchmarks.studies.scaling", option, WRITE, lambda p, g, option=option: [option, str(p)],
           name=f"damaged.{suffix}") for option, suffix in (("--json", "json"), ("--markdown", "md"),
                                                            ("--plot", "png"))),
    Case("benchmarks.studies.scaling", "--reread", READ, lambda p, g: ["--reread", str(p)], kind="json",
         name="damaged-scaling.json"),
    Case("scripts.pictures", "--translation", READ,
         lambda p, g: ["--out", str(g / "pictures"), "--translation", str(p), "--sentences", "Hello."]),
    Case("scripts.pictures", "--out", FOLDER_WRITE, lambda p, g: ["--out", str(p)], name="damaged-pictures"),
]
# not yet robust: the damages these commands still fail, each with the reason
XFAIL: dict[tuple[str, str, str], str] = {}


def run_command(program: str, argv: list[str]) -> tuple[object, str]:
    """``program``'s ``main(argv)`` here: its exit status (a returned int, or SystemExit's code)
    and what it wrote on stderr. Any other exception fails the test with its traceback."""
    module = importlib.import_module(program)
    if not hasattr(module, "main"):  # a package: its __main__.py is the command
        module = importlib.import_module(f"{program}.__main__")
    err = io.StringIO()
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = io.StringIO(), err
    try:
        try:
            status = module.main(argv)
        except SystemExit as stop:
            status = stop.code
        except BaseException as error:  # the one thing this test refuses
            sys.stdout, sys.stderr = stdout, stderr
            pytest.fail(f"{program} {' '.join(argv)}: a traceback, not one line:\n"
                        + "".join(traceback.format_exception(error)))
    finally:
        sys.stdout, sys.stderr = stdout, stderr
    if isinstance(status, str):  # sys.exit("message"): the message on stderr, status 1
        return 1, err.getvalue() + status + "\n"
    return (0 if status is None else status), err.getvalue()


def case_id(case: Case, damage: str) -> str:
    return f"{case.program} {case.argument}: {damage}"


PARAMS = [pytest.param(case, damage, id=case_id(case, damage),
                       marks=[pytest.mark.xfail(strict=True, reason=reason)] if (
                           reason := XFAIL.get((case.program, case.argument, damage))) else [])
          for case in CASES for damage in case.damages]


@pytest.fixture
def good(tmp_path) -> Path:
    """A folder for the good files a case writes beside its damaged one (none are read before
    the damaged file: an output is checked before its input is)."""
    folder = tmp_path / "good"
    folder.mkdir()
    return folder


@pytest.mark.parametrize(("case", "damage"), PARAMS)
def test_a_damaged_file_is_one_line_naming_it(case, damage, tmp_path, good, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing a command writes lands in the tree
    folder = tmp_path
    if case.inside is not None:
        folder = tmp_path / case.inside
        folder.mkdir()
    kind = case.kind
    path = damaged(folder, damage, kind, case.name)
    status, err = run_command(case.program, case.argv(path, good))
    lines = err.strip().splitlines()
    assert status in (1, 2), f"exit status {status!r}, not 1 or 2; stderr: {err}"
    assert len(lines) == 1, f"{len(lines)} lines on stderr, not one:\n{err}"
    named = {case.name, "damaged-blocker"} if damage == "under a regular file" else {case.name}
    if case.inside is not None and damage == "missing":
        named.add(case.inside)  # no file there: the folder is named
    assert any(name in lines[0] for name in named), f"the line does not name {named}: {lines[0]}"


def test_every_command_is_covered_or_declared_fileless():
    """A new command must be given its damaged files here, or be declared to take no path."""
    covered = {case.program for case in CASES}
    found = programs()
    assert found - covered - set(FILELESS) == set(), "commands neither covered nor declared fileless"
    assert (covered | set(FILELESS)) - found == set(), "covered or declared commands that no longer exist"
    assert covered & set(FILELESS) == set()
