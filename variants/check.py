"""Check an implementation against the reference: the equivalence battery, then, if the forward
disagrees, the first point of the computation where it does.

    python -m variants.check mypackage.model:Transformer       # an outside class (docs/check.md)
    python -m variants.check einsum --against explicit          # any two variants

Prints a table (check, result, largest difference, tolerance) and, after a failed forward check,
every probe point in order of computation with its largest |Δ|, the first past tolerance marked.
Exit status 0 if every check passes, 1 if one fails, 2 if SPEC cannot be built (one line).
"""

from __future__ import annotations

import sys

from tabulate import tabulate

from common.cli import Parser
from common.probes import first_divergence, number
from variants import REFERENCE, SpecError, variant_argument
from variants.battery import CONFIG, Result, locate, run_battery, short


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m variants.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", type=variant_argument, metavar="SPEC",
                        help="package.module:ClassName, an entry point's name or a registered variant")
    parser.add_argument("--against", type=variant_argument, default=REFERENCE, metavar="VARIANT",
                        help=f"what SPEC must agree with (default {REFERENCE}, the reference)")
    parser.add_argument("--seed", type=int, default=0, help="weights and batches (default 0)")
    args = parser.parse_args(argv)
    try:
        results = run_battery(args.spec, args.against, args.seed)
    except SpecError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    print(f"{args.spec} against {args.against}: d_model {CONFIG.d_model}, {CONFIG.n_heads} heads, "
          f"{CONFIG.n_layers} layers, seed {args.seed}\n")
    print(tabulate([(r.check, verdict(r), number(r.max_abs), r.tolerance) for r in results],
                   headers=("check", "result", "max |Δ|", "tolerance"), tablefmt="simple"))
    for result in results:
        if result.detail:
            print(f"  {result.check}: {result.detail}")
    failed = next((r for r in results if r.passed is False and r.case is not None), None)
    if failed is not None:
        print(finder_report(args.spec, failed, args.seed))
    return 0 if all(r.passed is not False for r in results) else 1


def verdict(result: Result) -> str:
    return {True: "pass", False: "FAIL", None: "skip"}[result.passed]


def finder_report(spec: str, failed: Result, seed: int) -> str:
    """The points of ``failed``'s forward case in order, the first past tolerance marked."""
    case = failed.case
    try:
        differences = locate(spec, case, seed)
    except LookupError as error:
        return f"\nno divergence finder: {error}"
    tolerance = case.tolerance.atol
    first = next((d for d in differences if d.diverges(tolerance)), None)
    rows = [(d.point, "-" if d.note else number(d.max_abs),
             d.note + (" <- first divergence" if d is first else "")) for d in differences]
    return (f"\nwhere {failed.check} first differs ({short(spec)} vs {short(case.against)}):\n\n"
            + tabulate(rows, headers=("point", "max |Δ|", ""), tablefmt="simple")
            + f"\n\n{first_divergence(differences, tolerance)}")


if __name__ == "__main__":
    sys.exit(main())
