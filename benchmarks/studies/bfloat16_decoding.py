"""How far decoding on bfloat16 or int8 weights agrees with float32 on a trained model's test split.

    python -m benchmarks.studies.bfloat16_decoding runs/fr/average.pt --threads 2 --output agreement.json
    python -m benchmarks.studies.bfloat16_decoding runs/fr/average.pt --rows int8   # int8 alone

The model file of a translation run, held by fused, decodes the test split of its corpus,
greedy and beam 4 each: the readable search in float32 (``seq2seq.search``, what
``python -m seq2seq.translate --score`` runs), always, and the fast path's static step in the
rows asked (``--rows``; by default every one this CPU runs), each with compare.py's levers
(``benchmarks.engines.rows.FAST_PATHS``: the flat step): "onednn float32" on oneDNN's packed
float32 linears, "onednn bfloat16" on linears packed in bfloat16 (``seq2seq.fast.onednn``, where
oneDNN has bfloat16 kernels), "int8" on int8 weights with int8 products (``seq2seq.fast.int8``,
where PyTorch has fbgemm; its inputs are quantized per call over the batch, so a sentence's
translation may depend on the others in its batch of ``translate_sentences``). For each it
reports corpus BLEU and chrF, the share of sentences whose translation is the float32 search's
word for word, and the seconds the split took. Decoding runs in one pass per row, one after
another, so the seconds are a first look; compare.py's interleaved rounds time them.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from benchmarks.engines.rows import FAST_PATHS
from common.bfloat16 import bfloat16_support
from common.cli import Parser, first_line, positive
from common.files import FileError, check_output
from seq2seq.data.corpus import CorpusSettings, load_corpus
from seq2seq.evaluation import corpus_scores
from seq2seq.fast.int8 import int8_available, with_int8_linears
from seq2seq.fast.onednn import packable_dtypes
from seq2seq.fast.static_search import StaticBeam, StaticGreedy
from seq2seq.pipeline import load_translation_model, translate_sentences
from seq2seq.search.beam import ALPHA, EXTRA_LENGTH

ROWS = ("float32 search", "onednn float32", "onednn bfloat16", "int8")  # the first is every run's baseline
SEARCHES = {"greedy": 1, "beam 4": 4}


@dataclass(frozen=True)
class Decoded:
    """One row's decoding of the test split with one search."""

    row: str
    search: str
    bleu: float
    chrf: float
    same_as_float32: float  # share of sentences translated exactly as the float32 search does
    seconds: float


def best_tokens(beam: StaticBeam) -> Callable[[Tensor, Tensor], Tensor]:
    """``beam`` as a search of ``translate_sentences``: the best hypothesis' ids."""
    def search(src: Tensor, src_mask: Tensor) -> Tensor:
        return beam(src, src_mask).tokens
    return search


def row_problem(row: str) -> str | None:
    """Why ``row`` (one of ROWS) cannot decode on this CPU, or None."""
    if row.startswith("onednn") and not torch.backends.mkldnn.is_available():
        return "the onednn rows need PyTorch built with oneDNN (torch.backends.mkldnn)"
    if row == "onednn bfloat16" and torch.bfloat16 not in packable_dtypes():
        return "oneDNN has no bfloat16 kernels on this CPU (they need AVX-512)"
    if row == "int8" and not int8_available():
        return "the int8 row runs PyTorch's fbgemm quantized engine (x86 CPUs), which this build lacks"
    return None


def runnable_rows() -> tuple[str, ...]:
    """The fast-path rows of ROWS this CPU decodes (the float32 search aside)."""
    return tuple(row for row in ROWS[1:] if row_problem(row) is None)


def fast_decoder(model: nn.Module, row: str, beam: int, ids: dict) -> Callable[[Tensor, Tensor], Tensor]:
    """``row``'s static decoder over ``model`` (greedy, or beam search of ``beam``), as a search
    of ``translate_sentences``."""
    if row == "int8":  # the levers of compare.py's row of the same name
        model, levers = with_int8_linears(model), FAST_PATHS["int8"] | ids
    else:
        levers = FAST_PATHS["onednn"] | dict(onednn_dtype=getattr(torch, row.removeprefix("onednn ")), **ids)
    return (StaticGreedy(model, **levers) if beam == 1 else
            best_tokens(StaticBeam(model, beam_size=beam, alpha=ALPHA, **levers)))


def decode_split(path: Path, threads: int | None = None,
                 rows: tuple[str, ...] | None = None) -> tuple[list[Decoded], dict]:
    """The float32 search and each of ``rows`` (fast-path rows of ROWS; None: every one this CPU
    runs) with every search on the test split of ``path``'s corpus; and what was run."""
    rows = runnable_rows() if rows is None else rows
    unknown = [row for row in rows if row not in ROWS[1:]]
    if unknown:
        raise ValueError(f"rows must be among {ROWS[1:]}, got {unknown}")
    if threads is not None:
        torch.set_num_threads(threads)
    record, vocabulary, model, normalization = load_translation_model(path, "fused")
    model.eval()
    corpus = load_corpus(CorpusSettings(**record.settings["data"]["corpus"]))
    sources = [example.source for example in corpus.test]
    references = [example.references for example in corpus.test]
    longest = max(len(ids) for ids in vocabulary.encode(sources)) + 1  # with EOS
    max_len = min(model.config.max_seq_len, longest + EXTRA_LENGTH + 1)  # the readable greedy's longest
    ids = dict(max_len=max_len, bos_id=vocabulary.start_id, eos_id=vocabulary.eos_id)
    results, baseline = [], {}
    for search, beam in SEARCHES.items():
        for row in (ROWS[0], *rows):
            decoder = None if row == ROWS[0] else fast_decoder(model, row, beam, ids)
            start = time.perf_counter()
            with torch.no_grad():
                lines = translate_sentences(model, vocabulary, sources, beam_size=beam, alpha=ALPHA,
                                            normalization=normalization, search=decoder)
            seconds = time.perf_counter() - start
            baseline.setdefault(search, lines)
            same = sum(a == b for a, b in zip(lines, baseline[search], strict=True)) / len(lines)
            scores = corpus_scores(lines, references)
            results.append(Decoded(row, search, scores.bleu, scores.chrf, same, seconds))
    support = bfloat16_support("cpu")
    run = {"model": str(path), "sentences": len(sources), "max_len": max_len, "rows": [ROWS[0], *rows],
           "threads": torch.get_num_threads(), "torch": torch.__version__,
           "bfloat16_native": support.native, "bfloat16_reason": support.reason}
    return results, run


def table(results: list[Decoded]) -> str:
    """A Markdown table, a row per decoder and search."""
    lines = ["| row | search | BLEU | chrF | same as float32 search | seconds |", "|---|---|---|---|---|---|"]
    lines += [f"| {r.row} | {r.search} | {r.bleu:.2f} | {r.chrf:.2f} | {r.same_as_float32:.1%} "
              f"| {r.seconds:.1f} |" for r in results]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m benchmarks.studies.bfloat16_decoding",
                    description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a translation run's model file (checkpoint or average)")
    parser.add_argument("--threads", type=positive(int), help="CPU threads (default: torch's)")
    parser.add_argument("--output", type=Path, help="also write the results as JSON here")
    parser.add_argument("--rows", nargs="+", choices=[row.replace(" ", "-") for row in ROWS[1:]],
                        help="the fast-path rows to decode beside the float32 search (default: every one "
                             "this CPU runs)")
    args = parser.parse_args(argv)
    rows = runnable_rows() if args.rows is None else tuple(dict.fromkeys(
        row.replace("-", " ") for row in args.rows))
    for row in rows:
        if problem := row_problem(row):
            parser.error(f"--rows {row.replace(' ', '-')}: {problem}")
    try:  # before the decodes: their results must not be lost to an output it cannot write
        output = args.output and check_output(args.output, inputs=[args.model])
    except FileError as error:
        parser.error(f"--output {error}")
    try:
        results, run = decode_split(args.model, args.threads, rows)
    except FileError as error:
        parser.error(str(error))
    except (FileNotFoundError, KeyError, LookupError, ValueError) as error:
        parser.error(f"{args.model}: {first_line(error)}")
    print(f"{run['sentences']:,} test sentences, {run['threads']} threads, "
          f"bfloat16: {run['bfloat16_reason']}")
    print(table(results))
    if output:
        output.write_text(json.dumps({"run": run, "results": [r.__dict__ for r in results]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
