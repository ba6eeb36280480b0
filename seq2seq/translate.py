"""Translate sentences with a trained translation model: a checkpoint of ``python -m seq2seq.train
--task translate`` or a model file averaged from them, which carries its own subword vocabulary,
or a checkpoint converted from Hugging Face (``python -m seq2seq.convert``), which carries its
own tokenizer.

    python -m seq2seq.translate runs/fr/average.pt "I'm hungry." "Where is the station?"
    echo "Thank you." | python -m seq2seq.translate runs/fr/average.pt --beam 1

Sentences come from the command line, or one per line from stdin when none are given (lines
may end in LF, CRLF or a lone CR); each translation is printed on its own line, in order, a
blank input line giving a blank output line. Beam search (beam 4, alpha 0.6) by default,
``--beam 1`` for greedy decoding. ``--score`` instead reports test BLEU and chrF, greedy and
beam 4, on the test split of the corpus the model was trained on (the path its settings name,
or ``--data``). A thin shell over ``seq2seq.pipeline``.

    python -m seq2seq.translate runs/fr/average.pt --score --data fra-eng.zip
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

from common.checks import check_number
from common.cli import Parser, device_or_exit, one_line, positive
from common.files import FileError, read_stream_text
from seq2seq.data.corpus import ATTRIBUTION, CorpusSettings, load_corpus
from seq2seq.data.subwords import Vocabulary
from seq2seq.evaluation import score_lines
from seq2seq.pipeline import evaluate, load_translation_model, translate_sentences
from seq2seq.search.beam import ALPHA, BEAM_SIZE
from seq2seq.storage.model_file import ModelFile
from variants import VARIANTS

PROG = "python -m seq2seq.translate"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options; a bad value is a one-line usage error (exit status 2)."""
    parser = Parser(prog=PROG, description="Translate sentences (arguments, or lines on stdin) with a "
                                           "trained translation model file.")
    parser.add_argument("model", type=Path, help="a checkpoint or averaged model file of a translate run")
    parser.add_argument("sentences", nargs="*", help="sentences to translate (default: read stdin)")
    parser.add_argument("--beam", type=positive(int), default=BEAM_SIZE,
                        help=f"beam size (default {BEAM_SIZE}; 1 is greedy decoding)")
    parser.add_argument("--alpha", type=float, default=ALPHA, help=f"length penalty (default {ALPHA})")
    parser.add_argument("--variant", choices=VARIANTS, default=None,
                        help="the variant to decode with (default: the one that trained)")
    parser.add_argument("--score", action="store_true",
                        help="report test BLEU and chrF (greedy and beam 4) instead of translating")
    parser.add_argument("--data", type=Path, default=None, metavar="PATH",
                        help="with --score: the corpus export, if not where the model's settings say")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=positive(int), default=None)
    args = parser.parse_intermixed_args(argv)  # options may come between or after the sentences
    try:
        check_number("--alpha", args.alpha, low_closed=True)
    except ValueError as error:
        parser.error(str(error))
    args.device = device_or_exit(parser, args.device)
    return args


def main(argv: list[str] | None = None) -> None:
    """Load the model file and its vocabulary, translate, print one line per sentence."""
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        record, vocabulary, model, normalization = load_translation_model(args.model, args.variant)
        model = model.to(args.device)
    except (FileNotFoundError, ImportError, LookupError, ValueError) as error:  # ImportError: a
        # converted checkpoint's tokenizer without its extra
        raise SystemExit(f"{PROG}: error: {one_line(error)}") from None
    if args.score:
        _score(args, record, model, vocabulary)
        return
    # one output line per input line, a blank one included (translated as a blank line)
    try:
        sentences = args.sentences or stdin_lines()
    except FileError as error:  # standard input that is not UTF-8 text
        raise SystemExit(f"{PROG}: error: {error}") from None
    try:
        translations = translate_sentences(model, vocabulary, sentences, beam_size=args.beam,
                                           alpha=args.alpha, normalization=normalization,
                                           banned_ids=record.banned_ids)
    except ValueError as error:  # a sentence longer than the model reads
        raise SystemExit(f"{PROG}: error: {one_line(error)}") from None
    for line in translations:
        print(line)


def stdin_lines() -> list[str]:
    """Standard input's lines, read as UTF-8 (a ``FileError`` naming standard input if it is not),
    each ending in LF, CRLF or a lone CR, as a text stream's universal newlines read them."""
    buffer = getattr(sys.stdin, "buffer", None)  # none: a stream already decoded (a test's)
    text = sys.stdin.read() if buffer is None else read_stream_text(buffer)
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return lines[:-1] if lines[-1] == "" else lines  # the last line's end starts no line


def _score(args: argparse.Namespace, record: ModelFile, model: torch.nn.Module,
           vocabulary: Vocabulary) -> None:
    """The test split's scores, as ``python -m seq2seq.train --task translate`` reports them."""
    try:
        settings = CorpusSettings(**record.settings["data"]["corpus"])
        if args.data is not None:
            settings = dataclasses.replace(settings, path=str(args.data))
        corpus = load_corpus(settings)
    except (KeyError, TypeError) as error:
        raise SystemExit(f"{PROG}: error: {args.model} names no corpus settings: {one_line(error)}") from None
    except ValueError as error:
        raise SystemExit(f"{PROG}: error: {one_line(error)}") from None
    print(f"{args.model}: test split, {len(corpus.test):,} English sentences of at most "
          f"{settings.max_words} words (data: {ATTRIBUTION})")
    for line in score_lines(evaluate(model, vocabulary, corpus.test, normalization=settings.normalization,
                                       banned_ids=record.banned_ids)):
        print(line)


if __name__ == "__main__":
    main()
