"""Print the README's concept map as the source defines it now.

    python -m scripts.concept_map

Each concept's title, then under each column the symbols its cell links, as
``path:first-last name`` (the cell's words where it links none).
"""

from __future__ import annotations

import sys
from pathlib import Path

from common.cli import Parser, first_line
from scripts.concept_map import ROOT, concepts, listing

COMMAND = "python -m scripts.concept_map"


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    parser = Parser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    try:
        text = listing(concepts(root))
    except (ValueError, SyntaxError, OSError) as error:
        print(f"{COMMAND}: {first_line(error)}", file=sys.stderr)
        return 1
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
