"""One way to read a user's file and to check where an output goes: every command and program
that takes a path reads through here, so a damaged file is one line naming it.

    settings = read_json(path, dict, "a compare.py report")     # FileError if it is not one
    with reading(path, "a sentencepiece model"):
        processor.Load(str(path))                               # whatever the library raises
    check_output(args.output, inputs=[args.model])              # before the work, not after

``FileError`` is a ``ValueError`` whose message is ``PATH: what is wrong`` on one line. It is raised
before any work that depends on the file's content; a command turns it into its one-line error
and a non-zero exit (``common.cli.Parser`` and each command's own handler).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from common.cli import file_problem, first_line

# the names JSON's top-level values have in a message
_JSON_KINDS = {dict: "object", list: "list", str: "string", int: "number", float: "number",
               bool: "boolean", type(None): "null"}


class FileError(ValueError):
    """A file that cannot be used as asked: ``PATH: what is wrong``, on one line."""

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        self.path = Path(path)
        self.problem = " ".join(problem.split())  # one line, whatever a library's text held
        super().__init__(f"{self.path}: {self.problem}")


def readable_file(path: str | os.PathLike) -> Path:
    """``path`` as a ``Path`` when it names a regular file this process may read; else a
    ``FileError`` saying which of missing, a directory, or unreadable it is."""
    path = Path(path)
    if not path.exists():
        raise FileError(path, "no such file")
    if path.is_dir():
        raise FileError(path, "is a directory, not a file")
    if not os.access(path, os.R_OK):
        raise FileError(path, "cannot be read (permission denied)")
    return path


@contextlib.contextmanager
def reading(path: str | os.PathLike, what: str) -> Iterator[Path]:
    """Run a library's read of ``path`` (checked to be a readable file first); anything it raises
    becomes a ``FileError``: ``PATH: not WHAT (the library's first line)``. An empty file is
    said to be empty, since libraries word that in many ways."""
    path = readable_file(path)
    if path.stat().st_size == 0:
        raise FileError(path, f"is empty, not {what}")
    try:
        yield path
    except FileError:
        raise
    except Exception as error:  # each library raises its own kinds for a damaged file
        raise FileError(path, f"not {what} ({type(error).__name__}: {first_line(error)})") from error


def read_bytes(path: str | os.PathLike) -> bytes:
    """The file's bytes (a ``FileError`` if it cannot be read)."""
    path = readable_file(path)
    try:
        return path.read_bytes()
    except OSError as error:
        raise FileError(path, f"cannot be read ({error.strerror or first_line(error)})") from None


def decode_text(data: bytes, name: str | os.PathLike) -> str:
    """``data`` decoded as UTF-8; otherwise a ``FileError`` naming ``name`` and the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        bad = data[error.start]
        raise FileError(name, f"is not UTF-8 text (byte 0x{bad:02x} at offset {error.start})") from None


def read_text(path: str | os.PathLike) -> str:
    """The file as UTF-8 text (a ``FileError`` if it is not)."""
    return decode_text(read_bytes(path), path)


def read_stream_text(stream: BinaryIO, name: str = "standard input") -> str:
    """A binary stream (``sys.stdin.buffer``) read whole as UTF-8 text, named ``name`` in a problem."""
    return decode_text(stream.read(), name)


def read_json(path: str | os.PathLike, kind: type | tuple[type, ...], what: str) -> object:
    """The JSON value in ``path``, which must be of ``kind`` (e.g. ``dict``, or ``(dict, list)``);
    empty, not JSON, or JSON of another kind is a ``FileError`` that says so and names ``what``."""
    text = read_text(path)
    if not text.strip():
        raise FileError(path, f"is empty, not {what}")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise FileError(path, f"is not JSON (line {error.lineno} column {error.colno}: {error.msg}), "
                                f"not {what}") from None
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        found = _JSON_KINDS.get(type(value), type(value).__name__)
        raise FileError(path, f"holds a JSON {found}, not {what}")
    return value


def check_output(path: str | os.PathLike, *, inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """``path`` as a ``Path`` once a file can be written there (its directory created if missing)
    and it is none of ``inputs`` nor inside one of them (a folder given as an input); otherwise a
    ``FileError``. Checked before the work, so no result is lost to a bad output path."""
    path = Path(path)
    target = path.resolve()
    for given in inputs:
        source = Path(given).resolve()
        if target == source or source in target.parents:
            where = "is" if target == source else "is inside"
            raise FileError(path, f"{where} the input {given}; write the output elsewhere")
    if problem := file_problem(path):
        raise FileError(path, problem.removeprefix(f"{path}: ").removeprefix(f"{path} "))
    return path


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)
