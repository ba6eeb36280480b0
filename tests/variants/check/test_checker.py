"""``python -m variants.check``: every built-in passes the battery, a correct outside copy passes,
each classic bug fails and the finder names where it starts; what cannot be built is one line."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from benchmarks.compare.run import run
from common.random_batch import random_batch
from compare import parse_args
from tests.fixtures.outside import tutorial
from tests.fixtures.outside.bugs import FIRST_DIVERGENCE
from variants import FROM_SCRATCH, REFERENCE, build
from variants.check.__main__ import main
from variants.check.battery import attempt, bad_inputs, forward, run_battery
from variants.check.diagnose import locate
from variants.check.divergence import first_divergence
from variants.check.harness import CONFIG, Case
from variants.check.tolerances import FLOAT64
from variants.explicit.model import Transformer as Explicit

ROOT = Path(__file__).resolve().parents[3]
OUTSIDE = "tests.fixtures.outside"
TUTORIAL = f"{OUTSIDE}.tutorial:Transformer"
BUGS = {f"{OUTSIDE}.bugs:{cls.__name__}": point for cls, point in FIRST_DIVERGENCE.items()}


def mode_checks(mode: str, masked_against: str) -> list[str]:
    """The battery's checks of one norm mode, in order."""
    return [*(f"forward {dtype} {mode} S={s} T={t}"
              for dtype, s, t in (("float64", 7, 5), ("float64", 4, 9), ("float32", 7, 5))),
            f"gradients float64 {mode}", f"3 Adam steps float64 {mode} (losses)",
            f"dropout sites {mode} (train mode, p=0.3)",
            f"fully masked source row {mode} vs {masked_against}"]


def first_forward_case(against: str = REFERENCE) -> Case:
    """The battery's first check: float64, post-norm, a padded batch with S = 7 > T = 5."""
    return Case(against, CONFIG, torch.float64, random_batch(CONFIG, 3, 7, 5).inputs(), FLOAT64)


@pytest.mark.parametrize("variant", [
    "explicit",  # one row by default; the battery is the same code for every row
    *(pytest.param(name, marks=pytest.mark.slow) for name in FROM_SCRATCH if name != "explicit"),
])
def test_every_builtin_passes_against_the_reference(variant):
    results = run_battery(variant)
    masked_against = "mathfirst" if variant == "explicit" else "explicit"
    expected = [*mode_checks("post-norm", masked_against), *mode_checks("pre-norm", masked_against)]
    assert [r.check for r in results] == [*expected, "bad inputs refused (5 of 5)"]
    failed = [(r.check, r.max_abs, r.detail) for r in results if r.passed is not True]
    assert not failed
    assert all(r.max_abs <= 1e-5 for r in results if r.max_abs is not None)


def test_a_correct_outside_copy_passes_and_the_table_says_so(capsys):
    assert main([TUTORIAL]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("check"))
    assert header.split() == ["check", "result", "max", "|Δ|", "tolerance"]
    rows = [line for line in out.splitlines() if line.startswith(("forward", "gradients", "3 Adam", "fully",
                                                                  "bad", "dropout sites"))]
    assert len(rows) == 15 and all(" pass " in row for row in rows)
    assert "norm modes checked: post-norm and pre-norm\n" in out
    assert "first divergence" not in out


@pytest.mark.parametrize("spec", BUGS)
def test_each_classic_bug_fails_and_the_finder_names_its_first_point(spec):
    """The battery's first forward check fails, and rerun point by point the first point past
    tolerance is the one the bug breaks; every point before it agrees to rounding."""
    case = first_forward_case()
    assert forward(spec, case, 0, "forward").passed is False
    differences = locate(spec, case)
    line = first_divergence(differences, FLOAT64.atol)
    assert line.startswith(f"first divergence: {BUGS[spec]} ("), line
    first = next(k for k, d in enumerate(differences) if d.diverges(FLOAT64.atol))
    assert all(d.max_abs < 1e-13 for d in differences[:first])


@pytest.mark.slow  # the command runs the battery to its first failure, then the finder (about 2 s)
def test_the_command_prints_the_finder_after_a_failed_forward(capsys):
    assert main([f"{OUTSIDE}.bugs:SwappedCrossKeysValues"]) == 1
    out = capsys.readouterr().out
    assert "where forward float64 post-norm S=7 T=5 first differs (SwappedCrossKeysValues vs torch):" in out
    marked = [line for line in out.splitlines() if "<- first divergence" in line]
    assert len(marked) == 1 and marked[0].startswith("decoder.layers.1.cross_attn ")
    located, explained = out.rstrip().splitlines()[-2:]
    assert located.startswith("first divergence: decoder.layers.1.cross_attn (max |Δ| ")
    assert explained.startswith("explained: keys projected with W_v and values with W_k; recomputed so, "
                                "decoder.layers.1.cross_attn matches the model to ")


def test_the_finder_works_between_any_two_models():
    """Outside against outside, and against a from-scratch built-in instead of the reference."""
    spec = f"{OUTSIDE}.bugs:Source1LayerNorm"
    for against in (TUTORIAL, "explicit"):
        line = first_divergence(locate(spec, first_forward_case(against)), FLOAT64.atol)
        assert line.startswith("first divergence: encoder.layers.0.norm1 ("), line
    assert first_divergence(locate("einsum", first_forward_case("mathfirst")), FLOAT64.atol).startswith(
        "no divergence")


def test_a_model_without_pre_norm_is_checked_post_norm_and_says_pre_norm_is_not_supported(capsys):
    assert main([f"{OUTSIDE}.broken:PreNormUnsupported"]) == 0
    out = capsys.readouterr().out
    assert "norm modes checked: post-norm; pre-norm: not supported: post-norm only\n" in out
    assert re.search(r"^pre-norm: every check +n/a ", out, flags=re.M)
    assert "pre-norm: every check: not supported: post-norm only" in out
    assert "fully masked source row post-norm vs explicit " in out
    assert "forward float64 pre-norm" not in out and "FAIL" not in out


@pytest.mark.parametrize(("spec", "says"), [
    ("nosuch", "argument SPEC: unknown variant 'nosuch'"),
    (f"{OUTSIDE}.tutorial:Nope", "has no attribute Nope"),
    (f"{OUTSIDE}.broken:NoWeightMap", "declares no weight_map"),
    (f"{OUTSIDE}.broken:IncompleteMap", "does not cover 2 canonical names: decoder.norm.weight, "
                                        "decoder.norm.bias"),
    (f"{OUTSIDE}.broken:TakesNumbers", "the checker builds TakesNumbers(config) from one TransformerConfig, "
                                       "but TakesNumbers.__init__ takes (d_model, heads)"),
    (f"{OUTSIDE}.broken:MisspeltProbe", "sends encoder.layers.0.ff to 'encoder.layers.0.feedforward'"),
])
def test_what_cannot_be_built_is_one_line_and_exit_2(spec, says, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([spec])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith("python -m variants.check: error: ") and says in line


@pytest.mark.slow  # a fresh interpreter (about 3 s); the in-process test checks the same line
def test_from_the_shell_a_bad_spec_is_one_line_and_no_traceback():
    done = subprocess.run([sys.executable, "-m", "variants.check", f"{OUTSIDE}.broken:IncompleteMap"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


class Unchecked(Explicit):
    """explicit with a forward that skips the interface's input checks."""

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        return self._project(self._decode(tgt, self._encode(src, src_mask), src_mask, tgt_mask))


def test_bad_inputs_a_model_does_not_refuse_fail_the_check():
    result = bad_inputs(f"{__name__}:Unchecked", 0)
    assert result.passed is False and result.check == "bad inputs refused (0 of 5)"
    assert "a tgt id past tgt_vocab_size: IndexError" in result.detail


def divide_by_zero():
    return 1 / 0


def test_a_check_whose_model_raises_fails_with_the_error_and_where_it_was_raised():
    result = attempt("forward", FLOAT64, CONFIG, divide_by_zero)
    lines = Path(__file__).read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if "return 1 / 0" in text)
    assert (result.passed, result.tolerance, result.bound) == (False, "1e-10", FLOAT64)
    assert result.detail == (f"ZeroDivisionError: division by zero "
                             f"(at tests/variants/check/test_checker.py:{line} in divide_by_zero)")


def test_the_reference_skips_its_fully_masked_row():
    results = {r.check: r for r in run_battery(REFERENCE)}
    assert results["fully masked source row"].passed is None
    assert all(r.passed for name, r in results.items() if name != "fully masked source row")


@pytest.mark.slow
@pytest.mark.parametrize("spec", BUGS)
def test_each_classic_bug_fails_the_whole_command(spec, capsys):
    """The last lines: the first divergence, then what explains it, or what was tried."""
    assert main([spec]) == 1
    lines = capsys.readouterr().out.rstrip().splitlines()
    located = next(line for line in lines if line.startswith("first divergence: "))
    assert located.startswith(f"first divergence: {BUGS[spec]} (")
    assert lines[-1] == located or lines[-1].startswith(("explained: ", "not explained by ")), lines[-2:]


@pytest.mark.slow
def test_the_forward_only_copy_passes_from_the_shell():
    done = subprocess.run([sys.executable, "-m", "variants.check", f"{OUTSIDE}.tutorial:ForwardOnly"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout


def test_build_of_an_unchecked_subclass_is_its_own_class():
    """A spec naming an EncoderDecoder subclass is built as it is (no adapter around it)."""
    assert type(build(f"{__name__}:Unchecked", CONFIG)) is Unchecked


COMPARE_TINY = ["--preset", "tiny", "--rounds", "1", "--min-run-time", "0.01", "--decode-len", "1",
                "--threads", "1", "--quiet"]


def test_compare_takes_an_outside_spec_beside_registered_names(capsys):
    """compare.py --variants: registered names in the registry's order, then specs as given."""
    settings, _ = parse_args([*COMPARE_TINY, "--variants", TUTORIAL, "torch", "explicit"])
    assert settings.variants == ("explicit", "torch", TUTORIAL)
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--variants", f"{OUTSIDE}.broken:NoWeightMap"])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("compare.py: error: argument --variants: ") and "declares no weight_map" in line


@pytest.mark.slow
def test_compare_times_an_outside_spec_and_compares_it_with_the_reference():
    settings, _ = parse_args([*COMPARE_TINY, "--variants", TUTORIAL])
    (block,) = run(dataclasses.replace(settings, keep_freed_memory=False))["blocks"]
    (row,) = block["rows"]
    assert row["variant"] == TUTORIAL and row["forward_ms"] > 0 and row["max_abs_dlogp"] < 1e-5


def test_the_finder_lines_in_the_docs_are_what_the_finder_prints():
    """docs/results/check-deviations.md quotes the finder on every bug fixture (its table): the point
    and its largest |Δ| as printed now (what agrees to rounding is only bounded: its last digits vary
    with the BLAS)."""
    page = (ROOT / "docs" / "results" / "check-deviations.md").read_text(encoding="utf-8").replace("\\|", "|")
    quoted = re.findall(r"^\| .+? \| `bugs:(\w+)` \| \d \| `(first divergence: [^`]*)` \|$", page, flags=re.M)
    assert sorted(name for name, _ in quoted) == sorted(cls.__name__ for cls in FIRST_DIVERGENCE)
    for name, line in quoted:
        printed = first_divergence(locate(f"{OUTSIDE}.bugs:{name}", first_forward_case()), FLOAT64.atol)
        head, _, before = printed.partition("; ")
        assert line == head, (line, printed)
        assert before == "nothing comes before it" or float(before.rpartition(" ")[2]) < 1e-13


class SwappedBiases(tutorial.Transformer):
    """A weight map that sends the cross-attention's key bias to the value projection and back."""

    weight_map: ClassVar[dict] = {
        **{name: target for name, target in tutorial.Transformer.weight_map.items()
           if not name.startswith(("decoder.layers.{i}.cross_attn.wk", "decoder.layers.{i}.cross_attn.wv"))},
        "decoder.layers.{i}.cross_attn.wk.weight": "decoder.layers.{i}.src_attn.linears.1.weight",
        "decoder.layers.{i}.cross_attn.wv.weight": "decoder.layers.{i}.src_attn.linears.2.weight",
        "decoder.layers.{i}.cross_attn.wk.bias": "decoder.layers.{i}.src_attn.linears.2.bias",
        "decoder.layers.{i}.cross_attn.wv.bias": "decoder.layers.{i}.src_attn.linears.1.bias",
    }


def test_the_battery_weights_make_a_swapped_bias_show():
    """init_canonical's biases are all zero; the battery's are not, so a map that misplaces one fails."""
    spec = f"{__name__}:SwappedBiases"
    assert forward(spec, first_forward_case(), 0, "forward").passed is False
    line = first_divergence(locate(spec, first_forward_case()), FLOAT64.atol)
    assert line.startswith("first divergence: decoder.layers.0.cross_attn ("), line
