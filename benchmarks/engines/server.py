"""The child of ``benchmarks.engines.isolated.Isolated``: builds the object it is sent and answers its
calls, pickled over stdin and stdout, until told to stop. Started by ``Isolated``, not by hand:

    python -m benchmarks.engines.server
"""

from __future__ import annotations

import sys

from benchmarks.engines.isolated import serve


def main() -> int:
    answers, sys.stdout = sys.stdout.buffer, sys.stderr  # the pipe carries answers alone
    serve(sys.stdin.buffer, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
