"""Static-shape decoding, eager and compiled, against the growing cache's, lever by lever:

    python -m benchmarks.studies.static_decode --device cuda --modes eager reduce-overhead \
        --search greedy beam
    python -m benchmarks.studies.static_decode --device cpu --modes eager default --freezing --onednn \
        --log-probs

times ``seq2seq.fast.static_search.StaticGreedy`` (and ``StaticBeam``, beam 4) on fused (the one row
with a static step) in each ``--modes`` entry ("eager", or a torch.compile mode: "default",
"reduce-overhead", which on CUDA captures the step as a CUDA graph), beside ``greedy_decode``
(``beam_search``) with the growing cache as the baseline, on one batch of random seeded weights.
``--freezing`` adds each compiled mode with inductor freezing (refused without a compiled mode);
``--onednn`` an eager row with the model's linears on oneDNN (``seq2seq.fast.onednn``, CPU
float32); ``--flat`` each eager row again on the flat step (``seq2seq.fast.flat``);
``--log-probs`` each greedy row with its argmax over the log-probabilities instead of
the logits. Each row first decodes twice untimed (compiling, then recording its graph), then is
timed by ``torch.utils.benchmark`` (which synchronises CUDA); the rows run one after another, so
run it on otherwise idle cores.
"same tokens" compares each row's ids with the baseline's. Speed is reported, never asserted.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tabulate import tabulate
from torch.utils.benchmark import Timer

from benchmarks.compare.workload import DTYPES, TIMING_PRESETS
from common.cli import Parser, device_or_exit, positive
from common.config import TransformerConfig
from common.random_batch import random_batch
from seq2seq.data.ids import BOS_ID, timing_eos_id
from seq2seq.fast.static_search import StaticBeam, StaticGreedy
from seq2seq.search.beam import beam_search
from seq2seq.search.greedy import greedy_decode
from variants import build

EAGER = "eager"
SEARCHES = ("greedy", "beam")
MODES = (EAGER, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's


@dataclass(frozen=True)
class StaticDecodeSettings:
    """One timing run of static decoding."""

    device: torch.device  # where the model and batch live
    dtype: torch.dtype  # the model's dtype
    preset: str  # benchmarks.compare.workload.TIMING_PRESETS
    batch: int  # sources decoded at once
    src_len: int  # source ids per row
    max_len: int  # ids per row, BOS included
    modes: tuple[str, ...]  # "eager" or a torch.compile mode, each a row
    min_run_time: float  # seconds of timed decodes per row
    searches: tuple[str, ...] = ("greedy",)  # "greedy", "beam" (beam 4): each its own rows
    freezing: bool = False  # each compiled mode frozen too, a row each
    log_probs: bool = False  # each greedy row with the argmax of the log-probs too
    onednn: bool = False  # an eager row with the model's linears on oneDNN (CPU float32)
    flat: bool = False  # each eager row again on the flat step (seq2seq.fast.flat)


def decoders(settings: StaticDecodeSettings, model: torch.nn.Module, src: torch.Tensor,
             src_mask: torch.Tensor, ids: dict) -> dict[str, Callable[[], torch.Tensor]]:
    """The rows by name, each search's baseline first; every call returns (B, L) ids."""
    rows = {}
    levers = [(mode, False, False, False) for mode in settings.modes]  # (mode, freezing, onednn, flat)
    if settings.freezing:
        levers += [(mode, True, False, False) for mode in settings.modes if mode != EAGER]
    if settings.onednn:  # eager only: inductor compiles no linear on weights packed outside it
        levers += [(EAGER, False, True, False)]
    if settings.flat:  # eager only: the flat step reads its position on the host
        levers += [(EAGER, False, onednn, True) for mode, _, onednn, _ in levers if mode == EAGER]
    for search in settings.searches:
        if search == "greedy":
            rows["greedy_decode (growing cache)"] = lambda: greedy_decode(model, src, src_mask, **ids)
        else:
            rows["beam_search (growing cache)"] = lambda: beam_search(model, src, src_mask, **ids).tokens
        for mode, freezing, onednn, flat in levers:
            options = dict(compile_mode=None if mode == EAGER else mode, freezing=freezing, onednn=onednn,
                           flat=flat)
            name = (f"static {search}, {mode}" + (", frozen" if freezing else "")
                    + (", oneDNN" if onednn else "") + (", flat" if flat else ""))
            if search == "beam":
                beam = StaticBeam(model, **options, **ids)
                rows[name] = lambda beam=beam: beam(src, src_mask).tokens
                continue
            for from_logits in (True, False) if settings.log_probs else (True,):
                greedy = StaticGreedy(model, **options, from_logits=from_logits, **ids)
                rows[name + ("" if from_logits else ", argmax of log-probs")] = (
                    lambda greedy=greedy: greedy(src, src_mask))
    return rows


def time_decoders(settings: StaticDecodeSettings) -> list[list[object]]:
    """A row per decoder: name, ms per decode, ms per step, tok/s, warm-up s, same tokens (as
    its search's baseline)."""
    config = TransformerConfig(**TIMING_PRESETS[settings.preset].fields)
    model = build("fused", config, seed=0).to(settings.device, settings.dtype).eval()
    batch = random_batch(config, settings.batch, settings.src_len, 1)
    src, src_mask = batch.src.to(settings.device), batch.src_mask.to(settings.device)
    ids = dict(max_len=settings.max_len, bos_id=BOS_ID, eos_id=timing_eos_id(config))
    expected, rows = None, []
    for name, decode in decoders(settings, model, src, src_mask, ids).items():
        started = time.perf_counter()
        for _ in range(2):  # compile, then record the CUDA graph (reduce-overhead's second call)
            tokens = decode()
        warm_up_s = time.perf_counter() - started
        expected = tokens if "growing cache" in name else expected
        seconds = Timer("decode()", globals={"decode": decode}).blocked_autorange(
            min_run_time=settings.min_run_time).median
        steps = tokens.shape[1] - 1
        rows.append([name, f"{1e3 * seconds:.1f}", f"{1e3 * seconds / steps:.2f}",
                     f"{settings.batch * steps / seconds:,.0f}", f"{warm_up_s:.1f}",
                     "yes" if torch.equal(tokens, expected) else "no"])
    return rows


def parse(argv: list[str] | None = None) -> StaticDecodeSettings:
    """The command line as settings; a bad option exits with a one-line usage error."""
    parser = Parser(prog="python -m benchmarks.studies.static_decode", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--preset", choices=list(TIMING_PRESETS), default="base")
    parser.add_argument("--batch", type=positive(int), default=8)
    parser.add_argument("--src-len", type=positive(int), default=64)
    parser.add_argument("--max-len", type=positive(int), default=65, help="ids per row, BOS included")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=[EAGER, "reduce-overhead"],
                        help="eager, or torch.compile's mode; a row each")
    parser.add_argument("--min-run-time", type=positive(float), default=1.0)
    parser.add_argument("--search", nargs="+", choices=SEARCHES, default=["greedy"],
                        help="greedy decoding, beam search (beam 4), or both: rows each")
    parser.add_argument("--freezing", action="store_true",
                        help="each compiled mode with inductor freezing too")
    parser.add_argument("--onednn", action="store_true",
                        help="an eager row with the model's linears on oneDNN (CPU float32)")
    parser.add_argument("--flat", action="store_true",
                        help="each eager row again on the flat step (seq2seq.fast.flat)")
    parser.add_argument("--log-probs", action="store_true",
                        help="each greedy row with the argmax of the log-probs too (the lever)")
    args = parser.parse_args(argv)
    config = TransformerConfig(**TIMING_PRESETS[args.preset].fields)
    if args.freezing and all(mode == EAGER for mode in args.modes):
        parser.error(f"--freezing applies to compiled modes only: give --modes a torch.compile mode too, "
                     f"got --modes {' '.join(args.modes)}")
    if args.flat and EAGER not in args.modes and not args.onednn:
        parser.error(f"--flat applies to eager rows only: give --modes eager or --onednn too, "
                     f"got --modes {' '.join(args.modes)}")
    if args.onednn and (args.device != "cpu" or args.dtype != "float32"):
        parser.error(f"--onednn is a CPU float32 lever, got --device {args.device} --dtype {args.dtype}")
    if not 2 <= args.max_len <= config.max_seq_len:
        parser.error(f"--max-len must lie in [2, max_seq_len={config.max_seq_len}]")
    if args.src_len > config.max_seq_len:
        parser.error(f"--src-len must be at most the preset's max_seq_len={config.max_seq_len}, "
                     f"got {args.src_len}")
    return StaticDecodeSettings(device_or_exit(parser, args.device), DTYPES[args.dtype], args.preset,
                                args.batch, args.src_len, args.max_len, tuple(args.modes), args.min_run_time,
                                tuple(dict.fromkeys(args.search)), args.freezing, args.log_probs, args.onednn,
                                args.flat)


def main(argv: list[str] | None = None) -> int:
    settings = parse(argv)
    rows = time_decoders(settings)
    print(f"fused, preset {settings.preset}, {settings.dtype}, {settings.device}, batch {settings.batch} x "
          f"src {settings.src_len}, up to {settings.max_len} ids (torch {torch.__version__})")
    print(tabulate(rows, ["decoder", "ms per decode", "ms per step", "tok/s", "warm-up s", "same tokens"],
                   tablefmt="github", disable_numparse=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
