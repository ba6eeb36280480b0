"""How each row's time and memory grow with the length: two sweeps, the decode scan, the fits.

    python -m benchmarks.studies.scaling --preset tiny
    python -m benchmarks.studies.scaling --json scaling.json --markdown scaling.md --plot scaling.png
    python -m benchmarks.studies.scaling --reread scaling.json --markdown again.md   # no timing

For every row (built through variants.build from one seed, the reference's weights transferred)
it times the forward (eval, no_grad) and the train step (forward, NLL, backward) at S = 32, 64,
... up to ``--max-len`` (source and target both S), at a fixed number of tokens per batch
(``--tokens``: batch = tokens // S) and at a fixed batch (``--batch``); a size whose predicted
peak passes ``--skip-gib`` is not run. Beside them it times one attention core alone at the
same shapes (SDPA for fused and torch, written out for the teaching rows): attention's share of
a step is 3 x n_layers cores over the step (projections not counted), and the table names the S
where it passes half. Then greedy decoding's time per token against the tokens in the cache,
cached and by full recompute. Each time is the median of ``--rounds`` rounds, the cells of a
size in a fresh shuffled order each round; the exponent k of time ∝ S^k is the least-squares
slope over every round's time at the top ``--fit-octaves`` octaves, with its 95% interval. Peak
memory is measured (profiler, as compare.py) and predicted from the tensors' shapes
(``analysis.predicted_peak``); the wall is the S at which the prediction reaches ``--wall-gib``.
``--reread`` reads a run's JSON and makes its fits, predictions and walls again with the
analysis as it stands, its times and measured peaks as they were. The picture needs matplotlib
(``pip install -e ".[plot]"``).
"""

from __future__ import annotations

import json
import math
import platform
import sys
from statistics import median
from typing import NamedTuple

import torch
from tabulate import tabulate
from tqdm import tqdm

from benchmarks.compare.machine import settle_threads
from benchmarks.compare.measured import Cell
from benchmarks.compare.plot import matplotlib_problem, path_problem
from benchmarks.compare.workload import TIMING_PRESETS
from benchmarks.studies.scaling import analysis
from benchmarks.studies.scaling.sweep import (
    PHASES,
    SWEEPS,
    ScalingSettings,
    SizeResult,
    build_rows,
    core_kind,
    decode_scan,
    measure_size,
    plan,
)
from common.cli import Parser, positive, seed_int
from common.config import TransformerConfig
from common.files import FileError, check_output, read_json
from variants import VARIANTS

DEFAULT_THREADS = 2  # on an idle machine; fewer cores found free give fewer
SMALLEST = 32  # the first length of the sweeps
FIRST_DECODE = 16  # the first cache length of the decode scan


class Preset(NamedTuple):
    """A model and the study's defaults for it."""

    fields: dict  # TransformerConfig fields (max_seq_len is set from the lengths)
    max_len: int  # the longest S
    tokens: int  # tokens per batch in the fixed-tokens sweep
    batch: int  # the fixed-batch sweep's batch
    decode_len: int  # the longest cache length decoded
    decode_batch: int
    decode_src: int
    rounds: int
    seconds: float  # each cell's block per round


PRESETS = {
    "tiny": Preset(TIMING_PRESETS["tiny"].fields, 64, 128, 2, 32, 2, 16, 2, 0.002),
    "base": Preset(TIMING_PRESETS["base"].fields, 2048, 1024, 1, 256, 8, 64, 2, 0.1),  # ~40 min on 2 cores
}


def parse(argv: list[str] | None) -> tuple[Parser, object]:
    parser = Parser(prog="python -m benchmarks.studies.scaling", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=list(PRESETS), default="base",
                        help="the model and the defaults below (tiny: seconds; base: about 40 minutes "
                             "on 2 cores)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), help="the rows")
    parser.add_argument("--max-len", type=positive(int), help=f"the longest S, at least {SMALLEST}")
    parser.add_argument("--tokens", type=positive(int), help="tokens per batch, fixed-tokens sweep")
    parser.add_argument("--batch", type=positive(int), help="the fixed-batch sweep's batch")
    parser.add_argument("--decode-len", type=positive(int),
                        help=f"the longest cache length, at least {FIRST_DECODE}")
    parser.add_argument("--decode-batch", type=positive(int),
                        help="sources decoded at once in the decode scan")
    parser.add_argument("--rounds", type=positive(int),
                        help="rounds of every cell, in a fresh shuffled order each")
    parser.add_argument("--seconds", type=positive(float), help="each cell's timed block per round")
    parser.add_argument("--fit-octaves", type=positive(int), default=2,
                        help="the exponent is fitted over the sizes within this many octaves of the largest")
    parser.add_argument("--wall-gib", type=positive(float), default=24.0,
                        help="the memory whose S each row's prediction names (default 24)")
    parser.add_argument("--skip-gib", type=positive(float), default=16.0,
                        help="a step whose predicted peak passes this is not run (default 16)")
    parser.add_argument("--threads", type=positive(int),
                        help="CPU threads (default 2, fewer when other processes hold cores)")
    parser.add_argument("--seed", type=seed_int, default=0, help="weights, batches and round orders")
    parser.add_argument("--json", help="write the measurements and fits here")
    parser.add_argument("--markdown", help="write the tables here")
    parser.add_argument("--plot", help="write the log-log picture here (.png)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--reread", metavar="JSON",
                        help="time nothing: analyse this run's --json again (its preset, lengths and rounds)")
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    for name in ("max_len", "tokens", "batch", "decode_len", "decode_batch", "rounds", "seconds"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(preset, name))
    if args.max_len < SMALLEST:
        parser.error(f"--max-len must be at least {SMALLEST}, got {args.max_len}")
    if args.decode_len < FIRST_DECODE:
        parser.error(f"--decode-len must be at least {FIRST_DECODE}, got {args.decode_len}")
    if args.tokens < SMALLEST:
        parser.error(f"--tokens must be at least {SMALLEST} (one sequence of the first length), "
                     f"got {args.tokens}")
    inputs = [args.reread] if args.reread else []  # no output may overwrite the run reread
    try:
        for path in (args.json, args.markdown, args.plot):
            if path:
                check_output(path, inputs=inputs)
    except FileError as error:
        parser.error(str(error))
    problem = args.plot and (path_problem(args.plot) or matplotlib_problem())
    if problem:
        parser.error(problem)
    if args.reread:
        try:
            args.recorded = read_json(args.reread, dict, "a scaling study's --json")
        except FileError as error:
            parser.error(str(error))
    return parser, args


def doublings(first: int, last: int) -> tuple[int, ...]:
    sizes = [first]
    while sizes[-1] * 2 <= last:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


def main(argv: list[str] | None = None) -> int:
    parser, args = parse(argv)
    if args.reread:
        return reread(parser, args)
    preset = PRESETS[args.preset]
    lengths, decode_lengths = doublings(SMALLEST, args.max_len), doublings(FIRST_DECODE, args.decode_len)
    longest = max(lengths[-1], decode_lengths[-1] + 1, preset.decode_src)
    config = TransformerConfig(**{**preset.fields, "max_seq_len": longest})
    choice = settle_threads(args.threads, DEFAULT_THREADS)
    if choice.line:
        print(f"{parser.prog}: {choice.line}", file=sys.stderr)
    torch.set_num_threads(choice.threads)
    settings = ScalingSettings(config, tuple(args.variants), lengths, args.tokens, args.batch, decode_lengths,
                               args.decode_batch, preset.decode_src, args.rounds, args.seconds,
                               choice.threads, args.seed, args.skip_gib * 2**30)
    rows = build_rows(settings)
    sizes = list(plan(settings))
    meta = {"preset": args.preset, "threads": choice.threads, "torch": torch.__version__,
            "machine": platform.machine(), "rounds": settings.rounds,
            "seconds_per_block": settings.min_run_time,
            "fit_octaves": args.fit_octaves, "wall_gib": args.wall_gib, "threads_note": choice.line}
    measured, decoding = [], {}
    with tqdm(total=(len(sizes) + 1) * settings.rounds, disable=args.no_progress, unit="round",
              dynamic_ncols=True) as bar:
        def tick(description: str) -> None:
            bar.set_description_str(description)
            bar.update()
        for sweep, length, batch in sizes:  # each finished size is written at once: a long run keeps its part
            measured.append(measure_size(settings, rows, sweep, length, batch, tick))
            write(summarise(settings, measured, decoding, args), meta, args, finished=False)
        decoding = decode_scan(settings, rows, tick)
    report = summarise(settings, measured, decoding, args)
    print(write(report, meta, args, finished=True))
    if args.plot:
        picture(report, args.plot)
    return 0


def reread(parser: Parser, args) -> int:
    """``--reread``: the recorded run's sizes and decode scan, analysed again (its settings from
    its meta and sizes); the tables printed and written as a run writes them."""
    recorded = args.recorded
    try:
        meta = recorded["meta"]
        preset = PRESETS[meta["preset"]]
        sizes = recorded["sizes"]
        lengths = tuple(sorted({size["length"] for size in sizes}))
        batch = next(size["batch"] for size in sizes if size["sweep"] == "batch")
        tokens = max(size["batch"] * size["length"] for size in sizes if size["sweep"] == "tokens")
        decoding = {d["row"]: {} for d in recorded["decode"]}
        for d in recorded["decode"]:
            decoding[d["row"]][d["mode"]] = {int(n): ts for n, ts in d["rounds_s"].items()}
        rows = tuple(dict.fromkeys(key.split("/")[0] for size in sizes for key in size["cells"]
                                   if not key.startswith("core:")))
        decode_lengths = tuple(sorted({n for modes in decoding.values() for by_length in modes.values()
                                       for n in by_length}))
        longest = max(lengths[-1], decode_lengths[-1] + 1 if decode_lengths else 0, preset.decode_src)
        config = TransformerConfig(**{**preset.fields, "max_seq_len": longest})
        settings = ScalingSettings(config, rows, lengths, tokens, batch, decode_lengths, 0, preset.decode_src,
                                   meta["rounds"], meta["seconds_per_block"], meta["threads"], args.seed,
                                   math.inf)
        measured = [recorded_size(size) for size in sizes]
        args.fit_octaves, args.wall_gib = meta["fit_octaves"], meta["wall_gib"]
        report = summarise(settings, measured, decoding, args)
    except (KeyError, TypeError, ValueError, StopIteration, AttributeError) as error:
        parser.error(f"{args.reread}: not a scaling study's --json ({type(error).__name__}: {error})")
    text = write(report, {**meta, "reread": args.reread}, args, finished=bool(meta.get("finished", True)))
    print(text)
    if args.plot:
        picture(report, args.plot)
    return 0


def recorded_size(size: dict) -> SizeResult:
    """One size of a recorded run as ``measure_size`` returned it; TypeError names a field that
    does not hold what a run writes there."""
    def numbers(name: str, values: object) -> list:
        if not isinstance(values, list) or not all(isinstance(v, int | float) and not isinstance(v, bool)
                                                   for v in values):
            raise TypeError(f"{name} must be a list of numbers, got {values!r}")
        return values

    cells = {key: Cell(rounds=numbers(f"{key} rounds_s", cell["rounds_s"]), error=cell["error"])
             for key, cell in size["cells"].items()}
    peaks = {key: numbers(f"{key} peak_bytes", [cell["peak_bytes"]])[0]
             for key, cell in size["cells"].items() if cell.get("peak_bytes") is not None}
    numbers("length and batch", [size["length"], size["batch"]])
    return SizeResult(size["sweep"], size["length"], size["batch"], cells, peaks, dict(size["skipped"]))


def write(report: dict, meta: dict, args, finished: bool) -> str:
    """Write the JSON and the tables as they stand (``finished`` False: the sizes so far, no
    decode scan yet, and the first line says so); return the tables."""
    report["meta"] = {**meta, "finished": finished}
    text = markdown(report)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=1)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as out:
            out.write(text + "\n")
    return text


def summarise(settings: ScalingSettings, measured: list, decoding: dict, args) -> dict:
    """The sizes as measured, and per sweep, row and phase: the exponent, the attention-share
    crossing and the memory wall; per row the decode exponents."""
    sizes = [result.as_dict(settings) for result in measured]
    attentions = 3 * settings.config.n_layers
    fits = []
    for sweep in SWEEPS:
        mine = [size for size in sizes if size["sweep"] == sweep]
        for row in settings.variants:
            for phase in PHASES:
                timed = [(s["length"], s["cells"].get(f"{row}/{phase}"),
                          s["cells"][f"core:{core_kind(row)}/{phase}"]) for s in mine]
                timed = [(n, cell, core) for n, cell, core in timed if cell and cell["median_s"]]
                fit = None
                if timed:
                    top = analysis.top_octaves([n for n, _, _ in timed], args.fit_octaves)
                    points = [(n, t) for n, cell, _ in timed if n in top for t in cell["rounds_s"]]
                    fit = analysis.fit_exponent(*zip(*points, strict=True)) if points else None
                shares = [(n, attentions * core["median_s"] / cell["median_s"]) for n, cell, core in timed]
                half = analysis.crossing(*zip(*shares, strict=True)) if shares else None

                def predict(length: int, sweep=sweep, row=row, phase=phase) -> float:
                    batch = settings.tokens / length if sweep == "tokens" else settings.batch
                    return analysis.predicted_peak(settings.config, row, phase, batch, length).total
                wall = analysis.memory_wall(predict, args.wall_gib * 2**30)
                fits.append({"sweep": sweep, "row": row, "phase": phase, "exponent": fit and fit.as_dict(),
                             "attention_shares": shares, "attention_half_at": half, "wall_length": wall})
    decode = []
    for row, modes in decoding.items():
        for mode, by_length in modes.items():
            if not any(by_length.values()):
                continue
            top = analysis.top_octaves(list(by_length), args.fit_octaves)
            points = [(n, t) for n in top for t in by_length[n]]
            fit = analysis.fit_exponent(*zip(*points, strict=True))
            decode.append({"row": row, "mode": mode, "exponent": fit and fit.as_dict(),
                           "per_token_s": {str(n): median(ts) for n, ts in by_length.items()},
                           "rounds_s": {str(n): ts for n, ts in by_length.items()}})
    spreads = [max(c["rounds_s"]) / min(c["rounds_s"]) - 1 for s in sizes for c in s["cells"].values()
               if len(c["rounds_s"]) > 1]
    return {"sizes": sizes, "fits": fits, "decode": decode,
            "resolution": {"widest_round_spread": max(spreads) if spreads else None}}


def interval(exponent: dict | None) -> str:
    if not exponent:
        return "–"
    if exponent["k_low"] is None:
        return f"{exponent['k']:.2f}"
    return f"{exponent['k']:.2f} [{exponent['k_low']:.2f}, {exponent['k_high']:.2f}]"


def markdown(report: dict) -> str:
    """The three tables: the fits, every size, the decode scan."""
    meta = report.get("meta", {})
    meta_line = ", ".join(f"{k} {v}" for k, v in meta.items() if v is not None and k != "finished")
    if meta.get("finished") is False:
        meta_line += " (unfinished: the sizes measured so far, no decode scan yet)"
    fits = [[f["sweep"], f["row"], f["phase"], interval(f["exponent"]),
             f"{f['attention_half_at']:.0f}" if f["attention_half_at"] else "not reached",
             f["wall_length"] or "beyond 2^24"] for f in report["fits"]]
    sizes = []
    for size in report["sizes"]:
        for key, cell in size["cells"].items():
            if key.startswith("core:"):
                continue
            row, phase = key.split("/")
            measured = f"{cell['peak_bytes'] / 2**20:.1f}" if cell.get("peak_bytes") else "–"
            ms = f"{1e3 * cell['median_s']:.2f}" if cell["median_s"] else cell["error"] or "–"
            sizes.append([size["sweep"], size["length"], size["batch"], row, phase, ms, measured,
                          f"{cell['predicted']['total'] / 2**20:.1f}"])
        sizes += [[size["sweep"], size["length"], size["batch"], *key.split("/"), why, "", ""]
                  for key, why in size["skipped"].items()]
    decode = [[d["row"], d["mode"], interval(d["exponent"]),
               *(f"{1e3 * t:.3f}" for t in d["per_token_s"].values())] for d in report["decode"]]
    lengths = list(report["decode"][0]["per_token_s"]) if report["decode"] else []
    spread = report["resolution"]["widest_round_spread"]
    return "\n\n".join([
        f"Scaling study: {meta_line}",
        "Exponents (time ∝ S^k, 95% interval), where attention's share passes half, and the S at which "
        "the predicted peak reaches the wall:",
        tabulate(fits, ["sweep", "row", "phase", "k", "attention ≥ half at S", "memory wall S"],
                 tablefmt="github", disable_numparse=True),
        tabulate(sizes, ["sweep", "S", "B", "row", "phase", "ms", "peak MiB", "predicted MiB"],
                 tablefmt="github", disable_numparse=True),
        "Decoding, ms per token against the tokens in the cache:",
        tabulate(decode, ["row", "mode", "k", *(f"L={n}" for n in lengths)], tablefmt="github",
                 disable_numparse=True),
        f"Resolution: each time a median over rounds; the widest spread between one cell's rounds "
        f"(slowest / fastest - 1) was {spread:.0%}." if spread is not None else "Resolution: one round."])


def picture(report: dict, path: str) -> None:
    """Log-log panels: each sweep's step time against S, the fixed-batch peak memory (measured,
    and predicted dashed), and decoding's time per token; a line per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 4, figsize=(18, 4.2), layout="constrained")
    colours = {row: f"C{i}" for i, row in enumerate(VARIANTS)}
    for ax, sweep in zip(axes[:2], SWEEPS, strict=True):
        for row in colours:
            for phase, style in (("train", "-"), ("forward", ":")):
                points = [(s["length"], s["cells"][f"{row}/{phase}"]["median_s"]) for s in report["sizes"]
                          if s["sweep"] == sweep and (s["cells"].get(f"{row}/{phase}") or {}).get("median_s")]
                if points:
                    ax.loglog(*zip(*points, strict=True), style, color=colours[row], marker=".",
                              label=f"{row} {phase}")
        ax.set_title(f"{sweep} sweep: step time (s)", fontsize=9)
    for row in colours:
        cells = [(s["length"], s["cells"].get(f"{row}/train"))
                 for s in report["sizes"] if s["sweep"] == "batch"]
        cells = [(n, c) for n, c in cells if c and c.get("peak_bytes")]
        if cells:
            axes[2].loglog([n for n, _ in cells], [c["peak_bytes"] / 2**20 for _, c in cells], "-",
                           color=colours[row], marker=".")
            axes[2].loglog([n for n, _ in cells], [c["predicted"]["total"] / 2**20 for _, c in cells], "--",
                           color=colours[row])
    axes[2].set_title("batch sweep: train peak MiB (dashed: predicted)", fontsize=9)
    for d in report["decode"]:
        lengths = [int(n) for n in d["per_token_s"]]
        axes[3].loglog(lengths, list(d["per_token_s"].values()), "-" if d["mode"] == "cached" else ":",
                       color=colours[d["row"]], marker=".")
    axes[3].set_title("decode: s per token (dotted: recompute)", fontsize=9)
    for ax in axes:
        ax.set_xlabel("S" if ax is not axes[3] else "tokens in the cache")
    axes[0].legend(fontsize=6)
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
