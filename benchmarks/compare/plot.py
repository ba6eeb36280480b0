"""The report as a picture (compare.py --plot FILE.png): per block, one panel per mode (forward,
train step, greedy decode), one bar per variant, its time relative to the reference's.

Forward and train bars carry the interquartile range of the step time as whiskers, divided by
the reference's median like the bar; the decode bar is the reference's tokens/s over the row's
(time per generated id), without whiskers (the report keeps no spread for decoding).
Needs matplotlib, the project's ``plot`` extra.
"""

from __future__ import annotations

import os
from pathlib import Path

from common.cli import write_probe
from variants import REFERENCE

EXTRA_HINT = "--plot needs matplotlib: pip install -e '.[plot]' (the plot extra)"
PANELS = (("forward", "forward"), ("train", "train step"), ("decode", "greedy decode"))


def path_problem(path: str, option: str = "--plot", suffix: str | None = ".png") -> str | None:
    """Why a file cannot be written to ``path`` (checked before any timing), or None.

    ``suffix``: the ending the file must have (a picture: .png); None takes any. Writability is
    found by creating and removing a small file beside it, which also catches a read-only file
    system and holds for root, whom permission bits do not stop.
    """
    target = Path(path)
    if suffix is not None and target.suffix.lower() != suffix:
        return f"{option} writes a {suffix[1:].upper()}: {path!r} does not end in {suffix}"
    if target.is_dir():
        return f"{option} {path!r} is a directory"
    folder = target.parent
    if folder.exists() and not folder.is_dir():
        return f"{option} {path!r}: {str(folder)!r} is a file, not a directory"
    if not folder.is_dir():
        return f"{option} {path!r}: no directory {str(folder)!r}"
    if write_probe(folder) or (target.exists() and not os.access(target, os.W_OK)):
        return f"{option} {path!r} is not writable"
    return None


def matplotlib_problem() -> str | None:
    """The missing extra's message when matplotlib cannot be imported, else None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return EXTRA_HINT
    return None


def relative_times(block: dict, mode: str) -> tuple[list[str], list[float], list[float]]:
    """Per variant that has a time for ``mode``: its name, time / the reference's, and the
    whisker's half-length (IQR / 2 / the reference's median; 0 for decoding)."""
    rows = block["rows"]
    reference = next((r for r in rows if r["variant"] == REFERENCE), None)
    names, values, spreads = [], [], []
    if reference is None:
        return names, values, spreads
    for row in rows:
        if mode == "decode":
            own, base = row.get("decode_tokens_per_s"), reference.get("decode_tokens_per_s")
            value, spread = (base / own, 0.0) if own and base else (None, None)
        else:
            own, base = row.get(f"{mode}_ms"), reference.get(f"{mode}_ms")
            value, spread = ((own / base, row[f"{mode}_iqr_ms"] / 2 / base) if own and base
                             else (None, None))
        if value is not None:
            names.append(row["variant"])
            values.append(value)
            spreads.append(spread)
    return names, values, spreads


def title(meta: dict, block: dict) -> str:
    """The machine, dtype and shape of one block."""
    device = block["device"]
    machine = meta["gpu_model"] if device == "cuda" else meta["cpu_model"]
    dtype = f"{block['dtype']} (autocast)" if meta["autocast"] else block["dtype"]
    return (f"{device}: {machine}, {meta['threads']} threads · {dtype}"
            f"{' · compiled' if meta['compile'] else ''} · preset {meta['preset']} · "
            f"batch {block['batch']} × src {block['src_len']} × tgt {block['tgt_len']}")


def plot(report: dict, path: str) -> None:
    """Write the report's picture to ``path``: a row of panels per block. Raises ImportError
    without matplotlib (check ``matplotlib_problem`` first)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    meta, blocks = report["meta"], report["blocks"]
    panels = [(mode, label) for mode, label in PANELS
              if any(relative_times(b, mode)[0] for b in blocks)]
    width = max(len(panels), 1)
    figure = plt.figure(figsize=(4.4 * width, 4.0 * len(blocks)), layout="constrained")
    for sub, block in zip(_as_list(figure.subfigures(len(blocks), 1)), blocks, strict=True):
        sub.suptitle(title(meta, block), fontsize=9)
        for ax, (mode, label) in zip(_as_list(sub.subplots(1, width)), panels, strict=False):
            names, values, spreads = relative_times(block, mode)
            colours = ["tab:grey" if n == REFERENCE else "tab:blue" for n in names]
            ax.bar(names, values, yerr=spreads, capsize=4, color=colours)
            ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
            ax.set_title(label)
            ax.set_ylabel(f"time / {REFERENCE}'s (lower is faster)")
            ax.tick_params(axis="x", labelrotation=30)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _as_list(axes_or_figures) -> list:
    """matplotlib hands back one object for a 1 x 1 grid and an array otherwise."""
    return list(getattr(axes_or_figures, "flat", [axes_or_figures]))
