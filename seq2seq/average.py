"""The command line of checkpoint averaging (``seq2seq.training.averaging``): the last K
checkpoints of a run become one model file whose weights are their mean (paper section 6.1).

    python -m seq2seq.average --checkpoint-dir runs/a --last 5 --output runs/a/average.pt
    python -m seq2seq.decode --model runs/a/average.pt
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common.cli import Parser, file_problem, one_line, positive
from seq2seq.storage.model_file import save
from seq2seq.training.averaging import average_files
from seq2seq.training.run import CHECKPOINT_NAME, list_checkpoints


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options; a one-line usage error (exit status 2) for an ``--output`` that bears a
    training checkpoint's name (``step-N.pt``, in any folder: a later ``--resume`` there would read
    the model file as a checkpoint) or that cannot be written."""
    parser = Parser(prog="python -m seq2seq.average",
                    description="Average the weights of the last K checkpoints of a run into one "
                                "model file that python -m seq2seq.decode loads.")
    parser.add_argument("--checkpoint-dir", type=Path, required=True,
                        help="the run's directory of step-NNNNNNNN.pt checkpoints")
    parser.add_argument("--last", type=positive(int), default=5, metavar="K",
                        help="how many of the newest checkpoints (the paper: 5)")
    parser.add_argument("--output", type=Path, required=True,
                        help="the model file to write, not named like a checkpoint (step-N.pt); its "
                             "directory is created if missing")
    args = parser.parse_args(argv)
    # before any checkpoint is read, or any folder made
    if CHECKPOINT_NAME.fullmatch(args.output.name):
        parser.error(f"--output {args.output}: step-N.pt is a training checkpoint's name; a run resumed "
                     f"in {args.output.parent} would take this model file for a checkpoint: name it "
                     "otherwise, e.g. average.pt")
    if problem := file_problem(args.output):
        parser.error(f"--output {problem}")
    return args


def main(argv: list[str] | None = None) -> None:
    """Pick the newest K checkpoints, average them, write the model file, say what was done."""
    args = parse_args(argv)
    found = list_checkpoints(args.checkpoint_dir)
    if len(found) < args.last:
        raise SystemExit(f"python -m seq2seq.average: error: --last {args.last} needs {args.last} "
                         f"checkpoints, {args.checkpoint_dir} holds {len(found)}")
    chosen = found[-args.last:]
    try:
        save(average_files(chosen), args.output)
    except (OSError, ValueError) as error:  # a file unreadable, unusable, or not writable after all
        raise SystemExit(f"python -m seq2seq.average: error: {one_line(error)}") from None
    names = ", ".join(path.name for path in chosen)
    print(f"averaged {len(chosen)} checkpoint{'' if len(chosen) == 1 else 's'} ({names}) into {args.output}")


if __name__ == "__main__":
    main()
