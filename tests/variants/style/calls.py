"""Record what a module is called with, so a style test can check what a call site passes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

from torch import nn


class Call(NamedTuple):
    """One call of a module: its positional arguments, keyword arguments and output."""

    args: tuple
    kwargs: dict
    output: object


@contextlib.contextmanager
def recording(*modules: nn.Module) -> Iterator[tuple[list[Call], ...]]:
    """One list per module, gaining a ``Call`` each time that module runs inside the block."""
    calls: tuple[list[Call], ...] = tuple([] for _ in modules)
    handles = [
        module.register_forward_hook(
            lambda _module, args, kwargs, output, into=into: into.append(Call(args, kwargs, output)),
            with_kwargs=True,
        )
        for module, into in zip(modules, calls, strict=True)
    ]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()
