"""The training command line (``python -m seq2seq.train``): it trains and reports, refuses bad
options in one line naming the setting's owner; and no module imports a command-line module,
so the command lines stay thin shells over the library."""

from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest

from seq2seq import decode
from seq2seq.train import main, parse_args

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("common", "variants", "seq2seq", "benchmarks", "scripts")


def test_cli_trains_and_reports(capsys, monkeypatch):
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    main(["--variant", "explicit", "--task", "reverse", "--steps", "3", "--batch", "4",
          "--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "16", "--eval-size", "8"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("final loss ")
    assert out[1].startswith("held-out exact-sequence accuracy: ")
    assert "/8 reverse sequences" in out[1]
    bar = stderr.getvalue()
    assert "\r[" in bar and "step 3/3" in bar and "tok/s" in bar and bar.endswith("\n")
    assert "loss " in bar and " lr " in bar


@pytest.mark.parametrize("argv", [
    ["--variant", "nope"],
    ["--task", "sort"],
    ["--steps", "0"],
    ["--steps", "ten"],
    ["--lr-factor", "-1"],
    ["--dropout", "1.5"],
    ["--vocab", "3"],
    ["--min-len", "5", "--max-len", "4"],
    ["--d-model", "30", "--heads", "4"],
    ["--device", "floppy"],
    ["--resume"],  # needs --checkpoint-dir
    ["--save-every", "5"],
    ["--checkpoint-dir", "runs", "--save-every", "0"],
])
def test_bad_cli_options_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "named"), [
    (["--vocab", "3"], "vocab_size"),  # tasks.check_settings
    (["--batch", "0"], "batch_size"),
    (["--min-len", "5", "--max-len", "4"], "min_len"),
    (["--d-model", "30", "--heads", "4"], "d_model"),  # TransformerConfig
    (["--dropout", "1.5"], "dropout"),
    (["--layers", "0"], "n_layers"),
    (["--warmup", "0"], "warmup"),  # Recipe
    (["--lr-factor", "-1"], "lr_factor"),
    (["--label-smoothing", "1"], "label_smoothing"),
])
def test_the_owner_of_a_setting_names_it_in_one_line(argv, named, capsys):
    """The CLI repeats no range check: each value is refused by the code that owns it."""
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "error:" in err and named in err, err


@pytest.mark.parametrize(("parse", "required"), [(parse_args, []), (decode.parse_args, ["--model", "x.pt"])],
                         ids=["train", "decode"])
def test_a_device_torch_does_not_know_is_a_usage_error_naming_the_option(parse, required, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse([*required, "--device", "floppy"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "error: --device floppy: " in err, err


def command_line_modules() -> set[str]:
    """The seq2seq modules that run as programs (``python -m seq2seq.NAME``)."""
    return {f"seq2seq.{path.stem}" for path in (ROOT / "seq2seq").glob("*.py")
            if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")}


def imported_modules(path: Path) -> set[str]:
    """Every dotted name an import in ``path`` may refer to: ``from a import b`` gives a and a.b."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_module_imports_a_command_line_module():
    """A command line's helpers are its own: what two commands share lives in the library
    (``seq2seq.evaluation``, ``common.cli``), never in another command's module."""
    commands = command_line_modules()
    assert {"seq2seq.train", "seq2seq.decode", "seq2seq.average"} <= commands
    paths = [path for package in LIBRARY for path in (ROOT / package).rglob("*.py")]
    offenders = sorted(f"{path.relative_to(ROOT)} imports {name}"
                       for path in [*paths, ROOT / "compare.py"]
                       for name in imported_modules(path) & commands)
    assert not offenders, offenders
