"""What every command line here shares: one-line usage errors, one positive-number type, one
seed type, a usable device, an error in one line, and turning the config's own validation into a
usage error.

    parser = Parser(prog="python -m seq2seq.train")
    parser.add_argument("--steps", type=positive(int), default=300)
    config = config_or_exit(parser, d_model=args.d_model, n_heads=args.heads)

``TransformerConfig`` is the one validator of model settings: a CLI passes the user's values
through it and reports its ``ValueError`` as ``prog: error: ...`` with exit status 2, instead of
repeating its range checks.
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import torch

from common.checks import SEED_HIGH, check_seed
from common.config import TransformerConfig


class Parser(argparse.ArgumentParser):
    """argparse, but a bad option is one line on stderr (exit status 2), not the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse ``type`` for a number of ``kind`` that must be > 0 and finite (an infinite
    time limit never ends, an infinite learning rate trains to NaN)."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not 0 < value < math.inf:
            finite = " and finite" if kind is float else ""  # int() never gives inf
            raise argparse.ArgumentTypeError(f"must be positive{finite}, got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def non_negative_int(text: str) -> int:
    """An argparse ``type``: an integer of at least 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def seed_int(text: str) -> int:
    """An argparse ``type``: a seed in 0..2**32 - 1, the range every consumer of a seed here
    takes (``common.checks.check_seed``: numpy refuses negative seeds, torch's generator keeps
    only a seed's low 32 bits and refuses those past 2**64 - 1)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer seed, got {text!r}") from None
    try:
        return check_seed("a seed", value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a seed in 0..{SEED_HIGH} (2**32 - 1), got {text}") from None


def config_or_exit(parser: argparse.ArgumentParser, base: TransformerConfig | None = None,
                   **fields) -> TransformerConfig:
    """``TransformerConfig(**fields)`` (or ``base.replace(**fields)``); a bad value is a usage error."""
    try:
        return base.replace(**fields) if base is not None else TransformerConfig(**fields)
    except (TypeError, ValueError) as error:
        parser.error(str(error))


def write_probe(folder: str | os.PathLike) -> OSError | None:
    """Create and remove a small file in ``folder``: the error that stops it, or None. Catches
    what permission bits do not show (a read-only file system, root), before a long run starts."""
    probe = os.path.join(folder, f".write-probe.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(probe, "xb"):
            pass
        os.unlink(probe)
    except OSError as error:
        return error
    return None


def directory_problem(directory: str | os.PathLike, named: str | os.PathLike | None = None) -> str | None:
    """Why files cannot be written into ``directory`` (created if missing), or None; the
    message starts with ``named`` (default: the directory), the path the user gave.

    Found by writing and removing a small file there, so a path under a regular file, a missing
    permission or a read-only file system shows before a run starts, not at its first save.
    """
    directory = Path(directory)
    named = directory if named is None else Path(named)
    for folder in (directory, *directory.parents):
        if folder.exists():
            if not folder.is_dir():
                where = "" if folder == named else f"{named}: "
                return f"{where}{folder} is a file, not a directory"
            break
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return f"{named}: cannot write files in {directory} ({error.strerror or first_line(error)})"
    if error := write_probe(directory):
        return f"{named}: cannot write files in {directory} ({error.strerror or first_line(error)})"
    return None


def file_problem(path: str | os.PathLike) -> str | None:
    """Why a file could not be written at ``path`` (its directory is created if missing), or None."""
    path = Path(path)
    if path.is_dir():
        return f"{path} is a directory; name a file"
    return directory_problem(path.parent, named=path)


def device_or_exit(parser: argparse.ArgumentParser, name: str, option: str = "--device") -> torch.device:
    """``torch.device(name)``, usable on this machine; anything else is a usage error naming ``option``."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as error:
        parser.error(f"{option} {name}: {first_line(error)}")
    if device.type == "meta":
        parser.error(f"{option} {name}: meta tensors hold no values; use cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"{option} {name}: CUDA is not available on this machine (torch {torch.__version__})")
    return device


def first_line(error: BaseException) -> str:
    """The first non-empty line of an error's message, or its type's name when it has none."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return lines[0].strip() if lines else type(error).__name__


def one_line(error: BaseException) -> str:
    """An error's whole message on one line: the errors here name their problems one per
    indented line under a heading, which become "heading problem; problem"."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    return " ".join([lines[0], "; ".join(lines[1:])]) if len(lines) > 1 else lines[0]


def error_line(error: BaseException) -> str:
    """``Type: first line`` of an error, or just ``Type`` when it has no message: one table cell or
    one line of a report."""
    name = type(error).__name__
    return f"{name}: {first_line(error)}" if str(error).strip() else name
