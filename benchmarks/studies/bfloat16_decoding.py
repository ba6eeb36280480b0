"""How far decoding on bfloat16 weights agrees with float32 on a trained model's test split.

    python -m benchmarks.studies.bfloat16_decoding runs/fr/average.pt --threads 2 --output agreement.json

The model file of a translation run, held by fused, decodes the test split of its corpus three
ways, greedy and beam 4 each: the readable search in float32 (``seq2seq.search``, what
``python -m seq2seq.translate --score`` runs), the fast path's static step on oneDNN's packed
float32 linears, and the same step on linears packed in bfloat16 (``seq2seq.fast.onednn``). For
each it reports corpus BLEU and chrF, the share of sentences whose translation is the float32
search's word for word, and the seconds the split took. Decoding runs in one pass per row, one
after another, so the seconds are a first look; compare.py's interleaved rounds time them.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from common.bfloat16 import bfloat16_support
from common.cli import Parser, first_line, positive
from common.files import FileError, check_output
from seq2seq.data.corpus import CorpusSettings, load_corpus
from seq2seq.evaluation import corpus_scores
from seq2seq.fast.static_search import StaticBeam, StaticGreedy
from seq2seq.pipeline import load_translation_model, translate_sentences
from seq2seq.search.beam import ALPHA, EXTRA_LENGTH

ROWS = ("float32 search", "onednn float32", "onednn bfloat16")
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


def decode_split(path: Path, threads: int | None = None) -> tuple[list[Decoded], dict]:
    """Every row with every search on the test split of ``path``'s corpus; and what was run."""
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
        for row in ROWS:
            decoder = None
            if row != ROWS[0]:
                dtype = torch.bfloat16 if row.endswith("bfloat16") else torch.float32
                levers = dict(onednn=True, onednn_dtype=dtype, **ids)
                decoder = (StaticGreedy(model, **levers) if beam == 1 else
                           best_tokens(StaticBeam(model, beam_size=beam, alpha=ALPHA, **levers)))
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
    run = {"model": str(path), "sentences": len(sources), "max_len": max_len,
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
    args = parser.parse_args(argv)
    if not torch.backends.mkldnn.is_available():
        parser.error("the onednn rows need PyTorch built with oneDNN (torch.backends.mkldnn)")
    try:  # before the six decodes: their results must not be lost to an output it cannot write
        output = args.output and check_output(args.output, inputs=[args.model])
    except FileError as error:
        parser.error(f"--output {error}")
    try:
        results, run = decode_split(args.model, args.threads)
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
