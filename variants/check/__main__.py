"""Check an implementation against the reference: the equivalence battery, then, if the forward
disagrees, the first point of the computation where it does.

    python -m variants.check mypackage.model:Transformer       # an outside class (docs/check.md)
    python -m variants.check mypackage.model:Transformer --norm pre --d-model 64 --heads 8
    python -m variants.check einsum --against explicit          # any two variants
    python -m variants.check mypackage.model:Transformer --suggest-maps   # draft maps to paste, run first
    python -m variants.check mypackage.model:Tied --share-embeddings       # a tied model, tied reference
    python -m variants.check explicit --activation silu --no-final-norm --positions marian --norm-eps 1e-5

Opens with the cause where one was found ("cause (point): ...": the departure that fits at the
first divergence, a failed check's hint, padded positions only, trained extra parameters), then
prints the config and the norm modes that ran, a table (check, result, largest difference,
tolerance) and, after a failed forward check, every probe point in order of computation with its
largest |Δ| and the reference's own float32 rounding there, the first point past both marked;
after a failed gradient or training check whose forward passes, the first weight whose gradient
differs and whether a module still drops at dropout 0; hints where the output or an error suggests
a classic mistake (logits, a -inf fill, a flat output, swapped masks, tied weights); and the
dropout sites that are missing or extra in train mode. A norm mode the class does not support
is reported as such, not failed. Exit status 0 if every check of a supported mode passes, 1 if
one fails, 2 if SPEC cannot be built in any mode asked for (one line).
"""

from __future__ import annotations

import argparse
import math
import re
import sys

from tabulate import tabulate

from common.cli import Parser, config_or_exit, error_line, positive, seed_int
from common.config import ACTIVATIONS, DECODER_STARTS, POSITIONS, TransformerConfig
from variants import REFERENCE, VARIANTS, SpecError, build, variant_argument, variant_class
from variants.check.adapter import drafting
from variants.check.battery import run_battery
from variants.check.diagnose import (
    MASK_HINT,
    explained,
    explanation,
    locate,
    padded_point,
    still_drops,
    trained_extras,
)
from variants.check.divergence import first_divergence, number, precision_notes
from variants.check.explain import Explanation
from variants.check.harness import CONFIG, MIN_VOCAB, MODES, STEPS, Result, absent_line, mode_name, short
from variants.check.outside import NORM_MODES, protocol
from variants.check.patterns import as_python
from variants.check.sites import REFERENCES, P
from variants.check.suggest import draft
from variants.check.verify import verified

NORM_CHOICES = {"post": ("post",), "pre": ("pre",), "both": MODES}


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m variants.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", type=variant_argument, metavar="SPEC",
                        help="package.module:ClassName, an entry point's name or a registered variant")
    parser.add_argument("--against", type=variant_argument, default=REFERENCE, metavar="VARIANT",
                        help=f"what SPEC must agree with (default {REFERENCE}, the reference)")
    parser.add_argument("--seed", type=seed_int, default=0, help="weights and batches (default 0)")
    parser.add_argument("--norm", choices=tuple(NORM_CHOICES), default="both",
                        help="the norm modes to check: post (the paper's), pre, or both (default both)")
    parser.add_argument("--d-model", type=positive(int), default=CONFIG.d_model,
                        help=f"model width (default {CONFIG.d_model})")
    parser.add_argument("--heads", type=positive(int), default=CONFIG.n_heads,
                        help=f"attention heads (default {CONFIG.n_heads})")
    parser.add_argument("--layers", type=positive(int), default=CONFIG.n_layers,
                        help=f"layers per stack (default {CONFIG.n_layers})")
    parser.add_argument("--d-ff", type=positive(int), default=CONFIG.d_ff,
                        help=f"feed-forward width (default {CONFIG.d_ff}, {CONFIG.d_ff // CONFIG.d_model} × "
                             f"d_model)")
    parser.add_argument("--decoder-d-ff", type=positive(int), default=None,
                        help="the decoder's feed-forward width, where it differs from the encoder's "
                             "(default: --d-ff)")
    parser.add_argument("--norm-eps", type=positive(float), default=CONFIG.norm_eps,
                        help=f"LayerNorm's eps, inside the square root (default {CONFIG.norm_eps:g}; "
                             f"nn.LayerNorm's is 1e-5)")
    parser.add_argument("--activation", choices=ACTIVATIONS, default=CONFIG.activation,
                        help=f"the feed-forward's nonlinearity (default {CONFIG.activation}; silu is swish)")
    parser.add_argument("--final-norm", action=argparse.BooleanOptionalAction, default=CONFIG.final_norm,
                        help="a LayerNorm after each stack, as torch.nn.Transformer (the default); "
                             "--no-final-norm: none, as Marian and fairseq")
    parser.add_argument("--positions", choices=POSITIONS, default=CONFIG.positions,
                        help=f"the sinusoid table (default {CONFIG.positions}, interleaved; marian: "
                             f"[sin | cos] halves; fairseq: halves from pad_id + 1)")
    parser.add_argument("--decoder-start", choices=DECODER_STARTS, default=CONFIG.decoder_start,
                        help=f"the decoder's first id (default {CONFIG.decoder_start}; pad: Marian's, eos: "
                             f"fairseq's); the battery's targets start with a real token")
    parser.add_argument("--vocab", type=positive(int), nargs=2, default=None,
                        metavar=("SRC", "TGT"), help=f"source and target vocabulary sizes (default "
                                                     f"{CONFIG.src_vocab_size} {CONFIG.tgt_vocab_size}); "
                                                     f"with --share-embeddings both {CONFIG.src_vocab_size} "
                                                     f"unless given")
    parser.add_argument("--share-embeddings", action="store_true",
                        help="one matrix for both embeddings and the generator (the paper's section 3.4), in "
                             "the reference too: for a model that ties them")
    parser.add_argument("--dropout-sites", choices=tuple(REFERENCES), default="torch",
                        help="whose dropout sites the train-mode check expects: torch "
                             "(torch.nn.Transformer's: embeddings, attention weights, feed-forward hidden "
                             "layer, sublayer outputs; the default) or paper (section 5.4: embeddings and "
                             "sublayer outputs only)")
    parser.add_argument("--suggest-maps", action="store_true",
                        help="print a draft weight_map and probe_map for SPEC's class, as Python to paste, "
                             "run against the reference first (verified, corrected where exchanging "
                             "same-shaped parameters makes it agree, or unverified), and exit")
    args = parser.parse_args(argv)
    if args.vocab is not None and min(args.vocab) < MIN_VOCAB:  # the battery's batches hold a real token
        parser.error(f"--vocab must be at least {MIN_VOCAB} each (padding and a real token), "
                     f"got {args.vocab[0]} {args.vocab[1]}")
    vocab = args.vocab or ((CONFIG.src_vocab_size,) * 2 if args.share_embeddings
                           else (CONFIG.src_vocab_size, CONFIG.tgt_vocab_size))
    config = config_or_exit(parser, CONFIG, d_model=args.d_model, n_heads=args.heads, n_layers=args.layers,
                            d_ff=args.d_ff, src_vocab_size=vocab[0], tgt_vocab_size=vocab[1],
                            share_embeddings=args.share_embeddings, decoder_d_ff=args.decoder_d_ff,
                            norm_eps=args.norm_eps, activation=args.activation, final_norm=args.final_norm,
                            positions=args.positions, decoder_start=args.decoder_start)
    try:
        if args.suggest_maps:
            print(suggested_maps(args.spec, config, NORM_CHOICES[args.norm], args.seed))
            return 0
        results = run_battery(args.spec, args.against, args.seed, config, NORM_CHOICES[args.norm],
                              args.dropout_sites)
    except SpecError as error:
        parser.exit(2, f"{parser.prog}: error: {error}{width_hint(str(error))}\n")
    failed = next((r for r in results if r.passed is False and r.case is not None), None)
    report, causes = "", {}
    if failed is not None:
        report, causes = finder_report(args.spec, failed, args.seed)
    elif (training := training_failure(results)) is not None:
        report, causes = training_report(args.spec, training, args.seed)
    lead = leading_cause(results, causes)
    if lead:
        print(lead)
    print(f"{args.spec} against {args.against}: d_model {config.d_model}, {config.n_heads} heads, "
          f"{config.n_layers} layer{'s' * (config.n_layers != 1)}, d_ff {config.d_ff}"
          f"{'' if config.decoder_d_ff is None else f' (the decoder {config.decoder_ff_dim})'}, vocabularies "
          f"{config.src_vocab_size} and {config.tgt_vocab_size}"
          f"{' (shared, tied to the generator)' if config.share_embeddings else ''}, seed {args.seed}")
    print(reference_line(args.against, config, args.dropout_sites))
    print(modes_line(results, NORM_CHOICES[args.norm]))
    for line in class_lines(args.spec, next(r.config for r in results if r.passed is not None)):
        print(line)
    absent = absent_line(args.spec, next(r.config for r in results if r.passed is not None))
    print((absent + "\n") if absent else "")
    print(tabulate([(r.check, verdict(r), number(r.max_abs), r.tolerance) for r in results],
                   headers=("check", "result", "max |Δ|", "tolerance"), tablefmt="simple"))
    hints = set()
    rounded = None  # the first check passed as float32 rounding only: its note is printed once
    for result in results:
        if result.precision and rounded is not None:
            print(f"  {result.check}: {result.detail.partition(':')[0]}, as above")
            continue
        if result.precision:
            rounded = result
        if result.detail:
            detail, _, hint = result.detail.partition("; hint: ")
            if hint == MASK_HINT and any("exchanged in decode" in seen for seen in hints):
                hint = next(seen for seen in hints if "exchanged in decode" in seen)  # the cause found above
            print(f"  {result.check}: {detail}" + (f"; hint: {hint}" if hint and hint not in hints
                                                   else "; hint: as above" if hint else ""))
            hints.add(hint)
    if report:
        print(report)
    passed = all(r.passed is not False for r in results)
    if passed and rounded is not None:
        print(f"\nevery check passes; {sum(r.precision for r in results)} of them within float32 rounding "
              f"only, which the model carries (the note above)")
    return 0 if passed else 1


def reference_line(against: str, config: TransformerConfig, dropout_sites: str) -> str:
    """What the model is held to: the reference's config values a model commonly departs from."""
    activation = {"relu": "ReLU", "gelu": "GELU", "silu": "SiLU"}.get(getattr(config, "activation", "relu"))
    final = "a final LayerNorm after each stack" if getattr(config, "final_norm", True) else \
        "no final LayerNorm"
    positions = getattr(config, "positions", "paper")
    table = "the paper's" if positions == "paper" else positions
    return (f"reference ({against}): post-norm x = norm(x + sublayer(x)) or pre-norm "
            f"x = x + sublayer(norm(x)) per mode, LayerNorm eps {config.norm_eps:g} (biased variance, inside "
            f"the root), {final}, {activation} feed-forward, scores ÷ √d_k = √{config.head_dim}, {table} "
            f"sinusoids (float64), log-probabilities out\ndropout: {config.dropout:g} in every check but the "
            f"sites check (p={P:g}, against {REFERENCES[dropout_sites]})")


def class_lines(spec: str, config: TransformerConfig) -> list[str]:
    """How the checker calls an outside class (when forward only, and why) and whether its maps
    were inferred."""
    if ":" not in spec and spec in VARIANTS:
        return []
    cls = type(build(spec, config))
    lines = []
    how = protocol(cls)
    if how.startswith("forward only"):
        lines.append(f"protocol: {how}")
    if getattr(cls, "inferred_maps", False):
        lines.append(f"maps: inferred from {short(spec)}'s modules "
                     f"(--suggest-maps prints them to read or paste)")
    return lines


def suggested_maps(spec: str, config: TransformerConfig, modes: tuple[str, ...], seed: int = 0) -> str:
    """The draft maps of ``spec``'s class (its own maps left out), built in the first of ``modes``
    it supports, then run against the reference: verified, corrected or unverified, said first
    (``variants.check.verify``). Whatever the class does, one line, never a traceback: SpecError."""
    cls = variant_class(spec)
    declared = getattr(cls, "norm_modes", None)
    for mode in modes:
        if isinstance(declared, (tuple, list)) and mode not in declared:
            continue  # the class says it does not run in this mode
        mode_config = config.replace(norm_first=NORM_MODES[mode])
        try:
            model = drafting(cls)(mode_config)
        except NotImplementedError:
            continue
        except Exception as error:
            raise SpecError(f"{spec}: {cls.__name__}(config) raised {explained(error, hint=False)}") \
                from error
        try:
            found = draft(model, mode_config)
        except Exception as error:  # a module the draft cannot read: say where, not a traceback
            raise SpecError(f"{spec}: --suggest-maps cannot read {cls.__name__}'s modules: "
                            f"{explained(error, hint=False)}") from error
        return as_python(verified(cls, found, mode_config, seed), mode_config, cls.__name__)
    raise SpecError(f"{spec}: can be built in none of the norm modes asked for")


def width_hint(message: str) -> str:
    """A pointer to --d-ff (--decoder-d-ff for the decoder's alone) where a build fails on the
    feed-forward's width."""
    found = re.search(r"(\w+)\.layers\.\d+\.ff\.w1\.weight \(\d+, \d+\) to \S+, which holds \((\d+), \d+\)",
                      message)
    if found is None:
        return ""
    option = "--decoder-d-ff" if found.group(1) == "decoder" else "--d-ff"
    return f"; hint: the model's {found.group(1)} feed-forward width is {found.group(2)}: pass {option} " \
           f"{found.group(2)}"


def verdict(result: Result) -> str:
    if result.passed is None:
        return "n/a" if result.detail.startswith("not supported") else "skip"
    return ("pass (f32)" if result.precision else "pass") if result.passed else "FAIL"


def modes_line(results: list[Result], asked: tuple[str, ...]) -> str:
    """Which norm modes ran, and which were asked for but are not supported."""
    unsupported = {r.check.partition(":")[0]: r.detail for r in results
                   if r.passed is None and r.detail.startswith("not supported")}
    ran = [mode_name(mode) for mode in asked if mode_name(mode) not in unsupported]
    return f"norm modes checked: {' and '.join(ran)}" + "".join(
        f"; {mode}: {why}" for mode, why in unsupported.items())


CAUSES = ("explained", "hint", "padded", "trained")  # what the checker found, the surest first


def leading_cause(results: list[Result], causes: dict[str, str]) -> str:
    """The line the report opens with: the surest cause found (``CAUSES``: the departure that
    fits at the first divergence, a failed check's hint, a difference at padded positions only,
    trained extra parameters), "" where none was found."""
    split = [(r.check, re.split(r"(?:^|; )hint: ", r.detail, maxsplit=1)) for r in results
             if r.passed is False]
    hints = [(check, parts[1]) for check, parts in split if len(parts) == 2]
    check, hint = next((found for found in hints if found[1] != MASK_HINT), hints[0] if hints else ("", ""))
    found = {**causes, "hint": f"cause ({check}): {hint}" if hint else ""}
    return next((found[kind] for kind in CAUSES if found.get(kind)), "")


def finder_report(spec: str, failed: Result, seed: int) -> tuple[str, dict[str, str]]:
    """The points of ``failed``'s forward case in order, the first past tolerance and past the
    reference's own float32 rounding marked, earlier precision-level departures noted; and the
    causes it found (``CAUSES``) as lines to lead the report."""
    case = failed.case
    try:
        differences = locate(spec, case, seed)
    except LookupError as error:
        return f"\nno divergence finder: {error}", {}
    tolerance = case.tolerance.atol
    first = next((d for d in differences if d.diverges(tolerance)), None)
    rows = [(d.point, "-" if d.max_abs is None or math.isinf(d.max_abs) else number(d.max_abs),
             number(d.rounding),
             re.sub(r"^not declared by (.*)", r"no module for it in \1 (None in its probe map)", d.note)
             + (" <- first divergence" if d is first else "")
             + (" float32 rounding" if d.departs(tolerance) and d.within_rounding() else ""))
            for d in differences]
    notes = "".join(f"\nnote: {note}" for note in precision_notes(differences, tolerance))
    padded = padded_point(spec, case, seed, first.point) if first is not None else ""
    try:
        found = explanation(spec, case, seed, differences)
    except Exception as error:  # the explanations are a bonus: never a traceback for them
        found = f"not explained: recomputing {first.point if first else 'it'} raised {error_line(error)}"
    why = found.line() if isinstance(found, Explanation) else found
    if padded:
        why = f"{padded}\n{why}" if why else padded
    causes = {"explained": f"cause ({found.point}): {found.cause}" if isinstance(found, Explanation) else "",
              "padded": f"cause: {padded}" if padded else ""}
    return (f"\nwhere {failed.check} first differs ({short(spec)} vs {short(case.against)}):\n\n"
            + tabulate(rows, headers=("point", "max |Δ|", "f32 rounding", "note"), tablefmt="simple")
            + f"\n{notes}\n{first_divergence(differences, tolerance)}" + (f"\n{why}" if why else "")), causes


def training_failure(results: list[Result]) -> Result | None:
    """The first failed gradient or training check of a mode whose forward checks all pass."""
    forward_failed = {r.config for r in results if r.check.startswith("forward") and r.passed is False}
    return next((r for r in results if r.passed is False and r.config not in forward_failed
                 and r.check.startswith(("gradients", f"{STEPS} Adam"))), None)


def training_report(spec: str, failed: Result, seed: int) -> tuple[str, dict[str, str]]:
    """Why a gradient or training check fails while the forward passes: the first weight whose
    gradient differs (its detail) and the determinism probe; and trained extra parameters as the
    cause to lead the report (``CAUSES``)."""
    try:
        drops = still_drops(spec, failed.config, seed)
    except Exception as error:  # the model's own error: the table has reported it already
        return f"\nno determinism probe: {explained(error)}", {}
    probe = (f"{drops} still drops: with dropout 0 in train mode, two seeds give different outputs"
             if drops else "with dropout 0 in train mode two seeds give the same outputs: nothing drops")
    lines = [probe]
    try:
        extras, sources = trained_extras(spec, failed.config, seed)
    except Exception:  # the model's own error: the table has reported it already
        extras, sources = [], []
    if extras:
        lines.insert(0, f"the model trains parameters the reference does not have (extra_parameters): "
                        f"{', '.join(extras)}; a loss's gradient reaches them, so each optimiser step moves "
                        f"them and the two models part")
    if sources:
        lines.append(f"float32 on the model's path: {'; '.join(sources)}")
    if not drops and failed.detail:
        lines.append(f"so the {'gradients' if failed.check.startswith('gradients') else 'losses'} themselves "
                     f"differ: {failed.detail}")
    return (f"\nwhy {failed.check} fails while the forward passes:\n"
            + "\n".join(f"  {line}" for line in lines), {"trained": f"cause: {lines[0]}" if extras else ""})


if __name__ == "__main__":
    sys.exit(main())
