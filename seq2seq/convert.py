"""Convert a Hugging Face translation model to a model file every variant loads: Helsinki-NLP
opus-mt (``MarianMTModel``) and fairseq's WMT19 (``FSMTForConditionalGeneration``). A thin shell
over ``seq2seq.hub.from_hf``; needs the ``hf`` extra (transformers, sacremoses).

    python -m seq2seq.convert Helsinki-NLP/opus-mt-en-de --output opus-mt-en-de.pt   # downloads
    python -m seq2seq.convert ./opus-mt-en-de --output opus-mt-en-de.pt              # a saved folder
    python -m seq2seq.translate opus-mt-en-de.pt "How are you?" --variant mathfirst

A hub name is downloaded by transformers (that needs a network); a folder is read as it is. The
model file carries the tokenizer, so translating needs neither transformers nor the folder
(docs/real-checkpoints.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common.cli import Parser, one_line
from common.files import FileError, check_output
from seq2seq.hub.from_hf import convert, hf_library, local_folder
from seq2seq.storage.model_file import save
from variants import VARIANTS

PROG = "python -m seq2seq.convert"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(prog=PROG, description="Convert a Hugging Face MarianMTModel or FSMTForConditional"
                                           "Generation (a folder, or a hub name) to a model file.")
    parser.add_argument("model", help="a folder saved by save_pretrained, or a hub name such as "
                                      "Helsinki-NLP/opus-mt-en-de (downloaded: needs a network)")
    parser.add_argument("--output", type=Path, required=True, help="the model file to write")
    parser.add_argument("--variant", choices=VARIANTS, default="explicit",
                        help="the variant python -m seq2seq.translate builds by default (default explicit)")
    args = parser.parse_args(argv)
    folder = Path(args.model).expanduser()
    try:  # never onto the folder read, nor into it (a hub name's files are checked once fetched)
        check_output(args.output, inputs=[folder] if folder.exists() else [])
    except FileError as error:
        parser.error(f"--output {error}")
    return args


def main(argv: list[str] | None = None) -> None:
    """Read the Hugging Face model, write the model file, say what it holds."""
    args = parse_args(argv)
    try:
        hf_library().utils.logging.disable_progress_bar()  # one line of output, not a loading bar
        check_output(args.output, inputs=[local_folder(args.model)])
        record = convert(args.model, variant=args.variant)
        save(record, args.output)
    except (ImportError, OSError, ValueError) as error:  # no extra, no such model, not convertible
        raise SystemExit(f"{PROG}: error: {one_line(error)}") from None
    config, hub = record.config, record.settings["hub"]
    ff = config.d_ff if config.decoder_d_ff is None else f"{config.d_ff}/{config.decoder_d_ff}"
    vocabularies = (f"one vocabulary of {config.src_vocab_size}" if config.share_embeddings
                    else f"vocabularies {config.src_vocab_size} and {config.tgt_vocab_size}")
    banned = f"; ids {hub['banned_ids']} never generated" if hub["banned_ids"] else ""
    generation = hub.get("generation_source", "generation_config.json")  # a default, where not the file
    if generation != "generation_config.json":
        banned += f"; {generation}" + ("" if banned else " (no ids banned)")
    print(f"wrote {args.output}: {hub['architecture']}, d_model {config.d_model}, {config.n_heads} heads, "
          f"{config.n_layers}+{config.n_layers} layers, FFN {ff} {config.activation}, {vocabularies}, "
          f"positions {config.positions!r}, decoder starts with {config.decoder_start}{banned}")


if __name__ == "__main__":
    main()
