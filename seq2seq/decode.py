"""Greedy decoding of a saved model, a checkpoint or an averaged model file, in any variant.

    python -m seq2seq.decode --model runs/a/average.pt --variant fused --show 3

Loads the file (``seq2seq.storage.model_file.load``), builds ``--variant`` (default: the variant that
trained it) around its canonical weights, and reports held-out exact-sequence accuracy on the
task it was trained on, as ``python -m seq2seq.train`` does at the end of training; ``--show N``
first prints N held-out sources with the model's greedy output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from common.cli import Parser, device_or_exit, one_line, positive
from common.masks import padding_mask
from seq2seq.data import ids
from seq2seq.data.tasks import TaskData
from seq2seq.evaluation import accuracy_line, held_out_accuracy, held_out_batch
from seq2seq.search.greedy import greedy_decode
from seq2seq.storage.model_file import build_model, load
from variants import VARIANTS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options; a bad value is a one-line usage error (exit status 2)."""
    parser = Parser(prog="python -m seq2seq.decode",
                    description="Decode held-out sequences greedily with a saved model and report "
                                "exact-sequence accuracy.")
    parser.add_argument("--model", type=Path, required=True,
                        help="a checkpoint (step-NNNNNNNN.pt) or a model file from seq2seq.average")
    parser.add_argument("--variant", choices=VARIANTS, default=None,
                        help="the variant to decode with (default: the one that trained)")
    parser.add_argument("--eval-size", type=positive(int), default=1000, help="held-out sequences")
    parser.add_argument("--show", type=int, default=0, metavar="N",
                        help="print N held-out sources and their decodings first")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=positive(int), default=None)
    args = parser.parse_args(argv)
    if args.show < 0:
        parser.error(f"--show must be 0 or more, got {args.show}")
    args.device = device_or_exit(parser, args.device)
    return args


def main(argv: list[str] | None = None) -> None:
    """Load, build, show a few decodings, report held-out accuracy."""
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        record = load(args.model)
        data = TaskData(**record.settings["data"])
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"python -m seq2seq.decode: error: {one_line(error)}") from None
    except (KeyError, TypeError) as error:  # a file written by other code than seq2seq.train
        raise SystemExit(f"python -m seq2seq.decode: error: {args.model} holds no usable task "
                         f"settings (settings['data']): {one_line(error)}") from None
    variant = args.variant or record.variant
    try:  # NaN weights, or an outside variant that cannot be imported or does not fit the weights
        model = build_model(record, variant).to(args.device).eval()
    except (LookupError, ValueError) as error:
        raise SystemExit(f"python -m seq2seq.decode: error: cannot build {variant} from "
                         f"{args.model}: {one_line(error)}") from None
    print(f"{variant}: {args.model} ({record.variant} trained it), "
          f"{data.task}", file=sys.stderr)
    if args.show > 0:
        src, _ = held_out_batch(data.task, args.show, seed=data.seed, **data.shape())
        src = src.to(args.device)
        decoded = greedy_decode(model, src, padding_mask(src, ids.PAD_ID), max_len=data.max_len + 2,
                                bos_id=ids.BOS_ID, eos_id=ids.EOS_ID)
        for source, output in zip(src.tolist(), decoded.tolist(), strict=True):
            print(" ".join(map(str, (t for t in source if t != ids.PAD_ID))), "->",
                  " ".join(map(str, (t for t in output[1:] if t not in (ids.PAD_ID, ids.EOS_ID)))))
    print(accuracy_line(held_out_accuracy(model, data, args.eval_size), args.eval_size, data.task))


if __name__ == "__main__":
    main()
