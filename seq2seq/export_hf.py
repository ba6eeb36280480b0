"""Write a model file as a Hugging Face ``MarianMTModel`` folder that transformers and
CTranslate2's converter load: a model trained here (``python -m seq2seq.train --task translate
--no-final-norm --norm-eps 1e-5``) or converted (``python -m seq2seq.convert``). A thin shell
over ``seq2seq.hub.to_hf``; needs the ``hf`` extra (transformers).

    python -m seq2seq.export_hf runs/fr/average.pt --output fr-hf
    python -c "from transformers import MarianMTModel; MarianMTModel.from_pretrained('fr-hf')"

A config MarianMTModel cannot compute is refused, one line naming each field
(docs/real-checkpoints.md). Where CTranslate2's Marian converter would not decode the folder as
transformers does (a model trained here: its decoder starts from BOS's learnt embedding), a
warning line on stderr says why (``seq2seq.hub.to_hf.ctranslate2_problems``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common.cli import Parser, one_line
from common.files import FileError, check_output, readable_file
from seq2seq.hub.to_hf import ctranslate2_problems, export, hf_library
from seq2seq.storage.model_file import load

PROG = "python -m seq2seq.export_hf"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(prog=PROG, description="Write a model file as a Hugging Face MarianMTModel folder.")
    parser.add_argument("model", type=Path, help="a model file or checkpoint (translation, or converted)")
    parser.add_argument("--output", type=Path, required=True, help="the folder to write (new, or empty)")
    args = parser.parse_args(argv)
    args.made_output = not args.output.exists()  # check_output makes the folder; a refusal removes it
    try:  # never onto the model file, nor into a folder that holds it
        readable_file(args.model)
        check_output(args.output / "config.json", inputs=[args.model])
        if args.model.resolve().is_relative_to(args.output.resolve()):
            raise FileError(args.output, f"holds the input {args.model}; write the output elsewhere")
    except FileError as error:
        parser.error(str(error))
    return args


def main(argv: list[str] | None = None) -> None:
    """Read the model file, write the folder, say what it holds."""
    args = parse_args(argv)
    try:
        hf_library().utils.logging.disable_progress_bar()  # its lines only, not a writing bar
        record = load(args.model)
        written = export(record, args.output)
    except (ImportError, OSError, ValueError) as error:  # no extra, a damaged file, a config refused
        if args.made_output and args.output.is_dir() and not any(args.output.iterdir()):
            args.output.rmdir()
        raise SystemExit(f"{PROG}: error: {one_line(error)}") from None
    print(f"wrote {args.output}: {written}")
    if problems := ctranslate2_problems(record):  # transformers decodes it; CTranslate2 would not
        print(f"{PROG}: warning: CTranslate2's Marian converter would not decode {args.output} as "
              f"transformers does: {'; '.join(problems)} (docs/real-checkpoints.md)", file=sys.stderr)


if __name__ == "__main__":
    main()
