"""The report as text: one table per block (any tabulate style), or JSON, or CSV."""

from __future__ import annotations

import csv
import io
import json
import sys
import textwrap

import tabulate as tabulate_module
from tabulate import tabulate, tabulate_formats

from benchmarks.compare.ratios import (
    CONTROL_TABLE_RATIOS,
    DECODE_BASELINE,
    DECODE_VS_BASELINE,
    TABLE_RATIOS,
    own_baseline,
    ratio_widths,
)
from variants import REFERENCE

FORMATS = (*tabulate_formats, "json", "csv")

# The default table: one screen wide (<= 120 characters in the github style at the presets'
# sizes; decode-only rows, the engines', in a narrow table of their own under it; the
# parameter count, the same in every row, in the header); every number below and in
# WIDE_COLUMNS stays in the json and csv output.
RATIO = "ratio"  # a column's format: a paired ratio, with its interval in the wide table
COMPACT_COLUMNS = [  # (title, report key, format; None = a time with its spread)
    ("variant", "variant", "{}"),
    ("fwd ms", "forward_ms", "{:.1f}"),
    (TABLE_RATIOS["forward_vs_torch"], "forward_vs_torch", RATIO),
    ("train ms", "train_ms", "{:.1f}"),
    (TABLE_RATIOS["train_vs_torch"], "train_vs_torch", RATIO),
    ("decode tok/s", "decode_tokens_per_s", "{:,.0f}"),
    (TABLE_RATIOS[DECODE_VS_BASELINE], DECODE_VS_BASELINE, RATIO),
    ("peak MB", "train_peak_mb", "{:,.0f}"),
    ("max Δ logp", "max_abs_dlogp", "{:.1e}"),
]
DECODE_ONLY_TITLE = "decode-only row"  # the compact form's table of engine and fast-path rows
SAME_MARK = "≈"
NO_CACHE = "no cache"  # a row that decodes by full recompute, in a cached-decoding ratio's cell
# the compact table's legend, a line each (the decode lines only with the decode columns)
RATIO_LEGEND = "×torch: the median over rounds of the row's time / torch's in the same round; < 1 is faster"
RATIO_LEGEND_PROCESSES = ("×torch: the row's time / torch's in the same round, its median in each process, "
                          "their geometric mean")
COMPACT_LEGEND = (
    "ms: a call's median time over rounds, so ms / torch's ms need not equal ×torch · "
    "peak MB: weights + train step",
)
DECODE_LEGEND = (
    f"decode: greedy with the row's key/value cache, ids per second; ×{DECODE_BASELINE}: time per id / "
    f"{DECODE_BASELINE}'s, paired alike",
    f"{REFERENCE} has {NO_CACHE}: it recomputes every step, so its tok/s is full recompute's, not compared",
)
SAME_LEGEND = (f"{SAME_MARK}: not told apart from the column's baseline: its 95% interval holds 1, "
               "or it lies inside the control's")
NOTE_WIDTH = 118  # a line under a table, after its two spaces of indent
WIDE_COLUMNS = [  # compare.py --wide: every column
    ("variant", "variant", "{}"),
    ("params M", "params", lambda v: f"{v / 1e6:.2f}"),
    ("fwd ms (IQR)", "forward_ms", None),
    ("train ms (IQR)", "train_ms", None),
    ("train tok/s", "train_tokens_per_s", "{:,.0f}"),
    ("fwd GFLOP/s", "forward_gflops", "{:.0f}"),
    ("train GFLOP/s", "train_gflops", "{:.0f}"),
    ("fwd % peak", "forward_pct_peak", "{:.0f}%"),
    ("train % peak", "train_pct_peak", "{:.0f}%"),
    ("fwd peak MB", "forward_peak_mb", "{:,.0f}"),
    ("train peak MB", "train_peak_mb", "{:,.0f}"),
    ("fwd vs torch [95%]", "forward_vs_torch", RATIO),
    ("train vs torch [95%]", "train_vs_torch", RATIO),
    ("max |Δ logp|", "max_abs_dlogp", "{:.1e}"),
    ("decode tok/s", "decode_tokens_per_s", "{:,.0f}"),
    (f"decode vs {DECODE_BASELINE} [95%]", DECODE_VS_BASELINE, RATIO),
    # with all_decoders (compare.py --all-decoders): the other decoders, the cache's speed-up and size
    ("uncached tok/s", "decode_uncached_tokens_per_s", "{:,.0f}"),
    ("beam-4 tok/s", "beam_tokens_per_s", "{:,.0f}"),
    ("beam vs torch [95%]", "beam_vs_torch", RATIO),
    ("cache speed-up [95%]", "decode_cache_speedup", RATIO),
    ("beam step / greedy step [95%]", "beam_step_vs_greedy", RATIO),
    ("cache KiB/token", "cache_bytes_per_token", lambda v: f"{v / 1024:,.0f}"),
    ("compile s", "compile_s", "{:.1f}"),
    ("fwd speed-up, compiled [95%]", "forward_compile_speedup", RATIO),
    ("train speed-up, compiled [95%]", "train_compile_speedup", RATIO),
]
COMPILE_COLUMNS = {"compile_s", "forward_compile_speedup", "train_compile_speedup"}
DECODE_COLUMNS = {"decode_tokens_per_s", DECODE_VS_BASELINE}  # cached greedy, unless decode_len 1
DECODERS_COLUMNS = {"decode_uncached_tokens_per_s", "beam_tokens_per_s", "beam_vs_torch",
                    "decode_cache_speedup", "beam_step_vs_greedy", "cache_bytes_per_token"}
TIMED_COLUMNS = ("forward_ms", "train_ms", "decode_tokens_per_s", "decode_uncached_tokens_per_s",
                 "beam_tokens_per_s")  # "OOM" or "error" on failure
MODES = ("forward", "train", "decode_uncached", "decode", "beam")  # by key prefix, longest first


def render(report: dict, fmt: str, wide: bool = False) -> str:
    """The whole report in ``fmt``: "json", "csv" or a tabulate style (one table per block, the
    compact columns, or every column when ``wide``)."""
    if fmt == "json":
        return json.dumps(report, indent=2)
    if fmt == "csv":
        return as_csv(report)
    meta = report["meta"]
    parts = []
    for block in report["blocks"]:
        tables, marked = [], False
        for rows in ([block["rows"]] if wide else compact_groups(block["rows"])):
            headers, lines = table_rows({**block, "rows": rows}, meta["compile"], meta["decode_len"] > 1,
                                        meta.get("all_decoders", False), wide)
            if len(headers) > 1:  # a decode-only table needs its decode columns
                marked |= any(text.startswith(SAME_MARK) for line in lines for text in line)
                tables.append(table(lines, headers, fmt))
        under = [f"  {line}" for note in notes(meta, block, wide, marked)
                 for line in textwrap.wrap(note, NOTE_WIDTH, subsequent_indent="  ", break_on_hyphens=False)]
        parts.append("\n".join([*header_lines(meta, block), "\n\n".join(tables), *under]))
    warnings = warning_lines(report)
    return "\n\n".join(["\n".join(warnings), *parts] if warnings else parts) + "\n"


def write_table(text: str, path: str | None) -> str | None:
    """The rendered report to ``path``, or to stdout when None. A failed write (the path was
    checked before timing, so a disk that filled up, say) puts it on stdout and says why."""
    if path is None:
        sys.stdout.write(text)
        return None
    try:
        with open(path, "w") as out:
            out.write(text)
    except OSError as error:
        sys.stdout.write(text)  # the run's result is not lost
        return f"cannot write {path} ({error.strerror or error}); the table is on stdout instead"
    return None


def table(lines: list[list[str]], headers: list[str], fmt: str) -> str:
    """``tabulate`` of the formatted cells, each column as wide as its widest entry: tabulate
    otherwise pads every title by two spaces (room for numbers it aligns; ours are strings),
    which alone would take the compact table past 120 characters."""
    padding = tabulate_module.MIN_PADDING
    tabulate_module.MIN_PADDING = 0
    try:
        return tabulate(lines, headers, tablefmt=fmt, disable_numparse=True)
    finally:
        tabulate_module.MIN_PADDING = padding


def as_csv(report: dict) -> str:
    """A line per (block, variant): the block's keys, then the row's. The columns are every key
    any row has, in the order they first appear (an engine's decode-only row lacks the variants'
    forward and train columns, a variant's row the engine's): a cell a row lacks is empty."""
    block_keys = ("device", "dtype", "batch", "src_len", "tgt_len")
    contended = {"run_contended": report["meta"].get("contended", False)}  # the run's, on every line
    records = [{**{k: b[k] for k in block_keys}, **r, **contended}
               for b in report["blocks"] for r in b["rows"]]
    buffer = io.StringIO()
    columns = [*dict.fromkeys(key for record in records for key in record if key not in contended),
               *contended] if records else list(block_keys)
    writer = csv.DictWriter(buffer, fieldnames=columns, restval="")
    writer.writeheader()
    writer.writerows(records)
    return buffer.getvalue()


def decode_only(result: dict) -> bool:
    """Whether a row times decoding only (a deployment engine's or a fast path's row,
    ``benchmarks.engines.rows``): no model of its own (no parameters) and no forward or train step."""
    return result.get("params") is None and "forward_ms" not in result and "train_ms" not in result


def compact_groups(rows: list[dict]) -> list[list[dict]]:
    """The compact form's tables: the variants' rows, then the decode-only rows in a table of
    their own (their name and decode columns), which in the variants' table would widen it
    past 120 characters with a column of dashes each; empty groups left out."""
    groups = [[r for r in rows if not decode_only(r)], [r for r in rows if decode_only(r)]]
    return [group for group in groups if group]


def table_rows(block: dict, show_compile: bool, show_decode: bool, show_decoders: bool = False,
               wide: bool = False) -> tuple[list[str], list[list[str]]]:
    """The column titles and a line of formatted cells per row of ``block``: the compact
    columns, or with ``wide`` every column the run measured. In the compact form, a block of
    decode-only rows alone gets the decode columns only, titled ``DECODE_ONLY_TITLE``."""
    rows = block["rows"]
    compiled_rows = any(result.get("compile_s") is not None for result in rows)  # inductor's
    columns = [c for c in (WIDE_COLUMNS if wide else COMPACT_COLUMNS)
               if (show_compile or c[1] not in COMPILE_COLUMNS or (c[1] == "compile_s" and compiled_rows))
               and (show_decode or c[1] not in DECODE_COLUMNS)
               and ((show_decode and show_decoders) or c[1] not in DECODERS_COLUMNS)]
    titles = [c[0] for c in columns]
    if not wide and rows and all(map(decode_only, rows)):
        columns = [c for c in columns if c[1] == "variant" or c[1] in DECODE_COLUMNS]
        titles = [DECODE_ONLY_TITLE, *(c[0] for c in columns[1:])]
    return titles, [[cell(result, key, fmt, wide) for _, key, fmt in columns] for result in rows]


def cell(result: dict, key: str, fmt, wide: bool = False) -> str:
    """One formatted cell: "OOM"/"error" for a failed step, "-" for nothing measured; a ratio
    as its value, marked ``SAME_MARK`` when not told apart from 1 (compact), or with its
    interval (``wide``)."""
    mode = next((m for m in MODES if key.startswith(m)), None)
    error = result.get(f"{mode}_error") if mode else None
    value = result.get(key)
    if error and key in TIMED_COLUMNS:
        return "OOM" if error == "OOM" else "error"
    if key == DECODE_VS_BASELINE and result.get("has_cache") is False and "decode_rounds_s" in result:
        return NO_CACHE  # full recompute: not compared with cached decoding
    if value is None:
        return "-"
    if fmt is None:
        return f"{value:.1f} ({result[key.replace('_ms', '_iqr_ms')]:.1f})"
    if fmt == RATIO:
        return ratio_text(result, key, wide)
    return fmt(value) if callable(fmt) else fmt.format(value)


def ratio_text(result: dict, key: str, wide: bool) -> str:
    """``1.12``, ``≈0.98`` (not told apart from 1: ``key_resolved`` False; a row's ratio to
    itself, the reference's ×torch, is 1 by definition and unmarked), or wide
    ``1.12 [1.09, 1.15]``."""
    value, low, high = result[key], result.get(f"{key}_low"), result.get(f"{key}_high")
    if wide:
        return f"{value:.2f} [{low:.2f}, {high:.2f}]" if low is not None else f"{value:.2f}"
    unresolved = result.get(f"{key}_resolved") is False and not own_baseline(result, key)
    return f"{SAME_MARK}{value:.2f}" if unresolved else f"{value:.2f}"


def header_lines(meta: dict, block: dict) -> list[str]:
    """The lines above a table: the machine (device, model, threads, torch), then the work
    (precision, preset, shape) and the matmul peak with its spread over the rounds, then, on
    CPU when other processes used its cores, how much and the threads chosen."""
    device = block["device"]
    model = meta["gpu_model"] if device == "cuda" else meta["cpu_model"]
    precision_mode = f"{block['dtype']} (autocast)" if meta["autocast"] else block["dtype"]
    if device == "cuda" and block["dtype"] == "float32" and block.get("float32_matmul_precision"):
        precision_mode += f" (matmuls in {block['float32_matmul_precision']})"
    if meta["compile"]:
        precision_mode += " · torch.compile" + (" with freezing" if meta["freeze"] else "")
    peak = f"matmul peak {block['matmul_peak_gflops']:,.0f} GFLOP/s"
    if block.get("matmul_peak_iqr_gflops") is not None:
        peak += f" (IQR {block['matmul_peak_iqr_gflops']:,.0f})"
    policy = f" · OMP_WAIT_POLICY {meta['omp_wait_policy']}" if meta.get("omp_wait_policy") else ""
    busy = busy_line(meta.get("cores", {}), meta["threads"]) if device == "cpu" else None
    threads = f"{meta['threads']} thread{'s' * (meta['threads'] != 1)}"
    return [f"{device}: {model} · {threads} · torch {meta['torch']}{policy}",
            f"{precision_mode} · preset {meta['preset']}{params_text(block['rows'])} · batch "
            f"{block['batch']} × src {block['src_len']} × tgt {block['tgt_len']} · {peak}",
            *([busy] if busy else [])]


def params_text(rows: list[dict]) -> str:
    """`` (9.31M params)``: the rows' parameter count, the same in every variant (a range where
    rows differ, e.g. a variant of one's own; --wide gives each); empty without one."""
    counts = sorted({row["params"] for row in rows if row.get("params") is not None})
    if not counts:
        return ""
    def millions(count: int) -> str:
        return f"{count / 1e6:.2f}M" if count >= 10**5 else f"{count:,}"

    span = millions(counts[0]) + (f"–{millions(counts[-1])}" if len(counts) > 1 else "")
    return f" ({span} params)"


def busy_line(cores: dict, threads: int) -> str | None:
    """``busy cores (2 here): others used 0.98 before timing, 1.01 during the run (load 1.02);
    1 thread, not 2``, or None when other processes left the cores alone."""
    busy_during = cores.get("free_during") is not None and cores["free_during"] < cores["cpus"]
    if not (cores.get("busy_before") or busy_during):
        return None
    readings = (("others_before", "before timing"), ("others_during", "during the run"))
    seen = ", ".join(f"{cores[key]:.2f} {when}" for key, when in readings if cores.get(key) is not None)
    load = next((f" (load {cores[key]:.2f})" for key in ("load_after", "load_before")
                 if cores.get(key) is not None), "")
    if cores.get("requested") is not None:
        how = f"--threads {threads} as asked"
    elif cores.get("default") not in (None, threads):
        how = f"{threads} thread{'s' * (threads != 1)}, not {cores['default']}"
    else:
        how = f"{threads} thread{'s' * (threads != 1)}"
    return f"busy cores ({cores['cpus']} here): others used {seen}{load}; {how}"


def contention_line(meta: dict) -> str | None:
    """The one line above every table when the run's threads outnumbered the free cores
    (before it, or on average during it), or None."""
    if not meta.get("contended"):
        return None
    cores = meta.get("cores", {})
    when = "during the run" if cores.get("contended_during") else "before the run"
    free = cores.get("free_during") if cores.get("contended_during") else cores.get("free_before")
    threads = meta["threads"]
    return (f"warning: timed on busy cores: {threads} thread{'s' * (threads != 1)}, {free} of "
            f"{cores.get('cpus')} cores free {when}; times inflated, ratios unreliable")


def notes(meta: dict, block: dict, wide: bool = False, marked: bool = False) -> list[str]:
    """The lines under a table: the compact table's legend, the unsteady mark's when a cell
    carries it, a CUDA shape too small to be compute-bound, failures, which SDPA kernels ran,
    the torch fast path, the allocator."""
    decoding = any(DECODE_VS_BASELINE in row or "decode_tokens_per_s" in row for row in block["rows"])
    ratio_legend = RATIO_LEGEND_PROCESSES if len(round_seeds(block)) > 1 else RATIO_LEGEND
    lines = [] if wide else [ratio_legend, *COMPACT_LEGEND, *(DECODE_LEGEND if decoding else ())]
    lines += [SAME_LEGEND] if marked else []
    lines += [line for line in (control_line(block), resolution_line(block, wide), rounds_line(block),
                                placement_line(meta)) if line]
    if block.get("small_shape_warning"):
        lines.append(f"warning: {block['small_shape_warning']}")
    for result in block["rows"]:
        for mode in MODES:
            error = result.get(f"{mode}_error")
            if error and error != "OOM":
                lines.append(f"{result['variant']} {mode}: {error}")
        if result["dlogp_error"]:
            lines.append(f"{result['variant']} log-prob check: {result['dlogp_error']}")
    sdpa = sdpa_note(block["rows"])
    if sdpa:
        lines.append(sdpa)
    reference = next((r for r in block["rows"] if r["variant"] == REFERENCE), None)
    if reference is not None:
        used = "uses" if reference["torch_fast_path"] else "does not use"
        lines.append(f"torch forward {used} nn.Transformer's fused eval fast path"
                     + ("" if reference["torch_fast_path"] else
                        " (disabled, or autocast/another condition turned it off)"))
        if reference["torch_fast_path"] and meta["autocast"] and block["device"] == "cpu":
            # its guard asks torch.is_autocast_enabled(), which only answers for CUDA
            lines.append("  ...under CPU autocast too, where its fused kernels run in float32")
    lines.append(f"allocator: {meta['allocator']}")
    return lines


def control_line(block: dict) -> str | None:
    """``control, torch ÷ its copy [95%]: fwd 1.00 [0.98, 1.03] · train ...``: the run's
    resolution, torch timed against a second copy of itself, or None without a control."""
    control = block.get("control")
    if not control:
        return None
    parts = [f"{label} {control[key]:.2f} [{control[f'{key}_low']:.2f}, {control[f'{key}_high']:.2f}]"
             for key, label in CONTROL_TABLE_RATIOS.items()
             if control.get(key) is not None and control.get(f"{key}_low") is not None]
    return f"control, {REFERENCE} ÷ its copy [95%]: {' · '.join(parts)}" if parts else None


def control_warnings(report: dict) -> list[str]:
    """A line for each of the control's ratios whose interval leaves 1 out: the run measured a
    difference between two copies of one model, which its intervals (made from the rounds'
    spread) do not hold, so its ratios for that mode are uncertain by about as much more."""
    lines = []
    for block in report["blocks"]:
        control = block.get("control") or {}
        where = (f" ({block['device']} {block['dtype']} B={block['batch']} S={block['src_len']} "
                 f"T={block['tgt_len']})" if len(report["blocks"]) > 1 else "")
        for key, label in CONTROL_TABLE_RATIOS.items():
            value, low, high = control.get(key), control.get(f"{key}_low"), control.get(f"{key}_high")
            if value is None or low is None or low <= 1.0 <= high:
                continue
            apart = max(abs(value - 1), 0.01)
            low_text, high_text = (f"{bound:.2f}" if f"{bound:.2f}" != "1.00" else f"{bound:.3f}"
                                   for bound in (low, high))  # a bound by 1 shows which side
            lines.append(f"warning: control {label} {value:.2f} [{low_text}, {high_text}] excludes 1{where}: "
                         f"{REFERENCE} and its copy differ by {apart:.0%}; "
                         f"read {label} ratios ±{apart:.0%} wider")
    return lines


def resolution_line(block: dict, wide: bool = False) -> str | None:
    """``ratios resolved to ±4.1% (95%; widest: explicit train ×torch)``: the widest relative
    half-width of the ratios the table prints and the control's (``report.ratio_widths``);
    with --resolution, whether it met the resolution asked, and if not, what fell short."""
    widths = ratio_widths(block)
    if not widths:
        return None
    if any(width is None for width in widths.values()):
        return "ratios unresolved: one round gives no interval"
    widest = max(widths, key=widths.get)
    shown = "" if wide else ", in --wide"
    line = f"ratios resolved to ±{widths[widest]:.1%} (95% intervals{shown}; widest: {widest})"
    rounds = block.get("rounds") or {}
    asked = rounds.get("resolution")
    if not asked:
        return line
    count = len(rounds.get("orders", []))
    short = [f"{label} ±{width:.1%}" for label, width in widths.items() if width > asked["target"]]
    if not short:
        return f"{line}: within the ±{asked['target']:.1%} asked, after {count} rounds"
    why = (f"the {asked['max_seconds']:g} s cap stopped it" if not asked["met"] else "stopped")
    return (f"{line}: not within the ±{asked['target']:.1%} asked; {why} after {count} rounds; "
            f"short: {', '.join(short)}")


def round_seeds(block: dict) -> list:
    """The seeds of the block's rounds' orders: one a process (a pooled block has several), none
    for a block without a record of its rounds."""
    seed = (block.get("rounds") or {}).get("seed")
    return [] if seed is None else seed if isinstance(seed, list) else [seed]


def rounds_line(block: dict) -> str | None:
    """``15 rounds, rows in a fresh order each (seed 0); 2 of them on busy cores``."""
    rounds = block.get("rounds") or {}
    if not rounds.get("orders"):
        return None
    count = len(rounds["orders"])
    busy = sum(1 for flag in rounds.get("contended", []) if flag)
    seeds = round_seeds(block)
    source = f" from {len(seeds)} processes" if len(seeds) > 1 else ""
    seed = f"seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else f"seed {seeds[0]}"
    return (f"{count} rounds{source}, rows in a fresh order each ({seed}); "
            f"{busy} of them on busy cores" + (" (in the intervals)" if busy else ""))


def placement_line(meta: dict) -> str | None:
    """Whether each row's weights were re-placed in fresh memory before every round
    (``benchmarks.compare.placement``), and, for one process, that what the process keeps for all its
    rounds is still outside the intervals (docs/results/cpu-small-coverage.md); None for a
    report that does not say (made before the option)."""
    if "replace_weights" not in meta:
        return None
    if meta["replace_weights"]:
        line = "weights re-placed in fresh memory each round"
        if meta.get("processes", 1) == 1:
            line += "; one process's own spread is not in the intervals: --processes 3 puts it there"
        return line
    why = "--compile" if meta.get("compile") else "--no-replace-weights"
    return f"weights kept in place ({why}): where they lie is not in the intervals"


def warning_lines(report: dict) -> list[str]:
    """The lines above every table that say how far to trust it: threads outnumbering the free
    cores, rounds on busy cores, fewer threads than an idle machine would use, bfloat16 timed
    where the CPU only emulates it, a control that told two copies of torch apart."""
    meta = report["meta"]
    lines = (contention_line(meta), busy_rounds_line(report), fewer_threads_line(meta), emulated_line(report))
    return [*(line for line in lines if line), *control_warnings(report)]


def emulated_line(report: dict) -> str | None:
    """The line above every table that times bfloat16 on a CPU without native bfloat16 (a CPU
    block in bfloat16, or a row such as ``onednn bfloat16``): those times are emulation's."""
    support = report["meta"].get("bfloat16_cpu")
    if not support or support["native"]:
        return None
    timed = [block for block in report["blocks"] if block["device"] == "cpu" and (
        block["dtype"] == "bfloat16" or any(row["variant"].endswith(" bfloat16") for row in block["rows"]))]
    if not timed:
        return None
    return (f"warning: bfloat16 timed on a CPU without it ({support['reason']}): its times are "
            "emulation's, not what bfloat16 gives where the CPU has it")


def fewer_threads_line(meta: dict) -> str | None:
    """The line above every table when the run chose fewer threads than it would on an idle
    machine (others held cores before timing): its ratios are that many threads' ratios."""
    cores, threads = meta.get("cores", {}), meta["threads"]
    if cores.get("requested") is not None or cores.get("default") in (None, threads):
        return None
    count = f"{threads} thread{'s' * (threads != 1)}"
    return (f"note: timed with {count}, not {cores['default']}, as others held cores: these ratios are "
            "for that count and may differ from an idle run's")


def busy_rounds_line(report: dict) -> str | None:
    """The line above every table when some rounds ran while others' work left fewer free cores
    than the run's threads (a load that came and went may not move the run's average), or None."""
    counts = [(sum(1 for flag in block.get("rounds", {}).get("contended", []) if flag),
               len(block.get("rounds", {}).get("contended", []))) for block in report["blocks"]]
    busy, total = sum(b for b, _ in counts), sum(t for _, t in counts)
    if not busy:
        return None
    others = max((value for block in report["blocks"]
                  for value in block.get("rounds", {}).get("others", []) if value is not None), default=0.0)
    return (f"warning: {busy} of {total} rounds ran on busy cores (others used up to {others:.2f} "
            "cores); read each ratio with its interval")


def sdpa_note(rows: list[dict]) -> str | None:
    """Which scaled_dot_product_attention kernels each row ran, or None if no row called it."""
    ran = []
    for result in rows:
        modes = [f"{mode} {result[key]}" for mode, key in (("forward", "sdpa_backend"),
                                                            ("train", "sdpa_backend_train"))
                 if result.get(key)]
        if modes:
            ran.append(f"{result['variant']} {', '.join(modes)}")
    return f"SDPA kernel: {'; '.join(ran)}" if ran else None
