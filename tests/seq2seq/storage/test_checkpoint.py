"""Checkpoints resume a run exactly, are refused when damaged or from another run (leaving every
file as it was), and average into a model that the decoding command loads into any variant."""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch

from common.weights import canonical_shapes, export_weights
from seq2seq import average, decode
from seq2seq import train as train_cli
from seq2seq.data.tasks import TaskBatches, TaskData, task_batches
from seq2seq.storage.model_file import ModelFile, build_model, load, load_checkpoint, save
from seq2seq.training import run
from seq2seq.training.averaging import average_files, average_weights
from seq2seq.training.recipe import Recipe
from seq2seq.training.run import RunSettings, checkpoint_path, latest_checkpoint, list_checkpoints
from seq2seq.training.trainer import Trainer
from tests.helpers import small_config
from variants import build

CONFIG = small_config(dropout=0.1)  # dropout on: a resume must restore the RNG to be exact
RECIPE = Recipe(warmup=5)


def fresh(variant: str = "explicit", config=CONFIG, batch_size: int = 6, recipe: Recipe = RECIPE,
          dtype: torch.dtype = torch.float64) -> Trainer:
    model = build(variant, config, seed=0).to(dtype)
    batches = task_batches("reverse", batch_size, vocab_size=19, min_len=1, max_len=9, seed=1)
    return Trainer(model, batches, recipe)


def files(directory) -> dict[str, bytes]:
    """Every file under ``directory`` and its bytes."""
    return {str(path.relative_to(directory)): path.read_bytes()
            for path in sorted(directory.rglob("*")) if path.is_file()}


def saved_run(directory, steps=(1, 2, 3), variant: str = "explicit", **changes) -> list:
    """One run that writes a checkpoint after each of ``steps``; their paths."""
    torch.manual_seed(0)
    trainer = fresh(variant, **changes)
    paths = []
    for step in steps:
        trainer.run(step)
        paths.append(save(trainer.checkpoint(variant), checkpoint_path(directory, step)))
    return paths


# --- resuming ------------------------------------------------------------------------------


def test_resume_continues_exactly(variant, tmp_path):
    """6 steps straight equal 3 steps, a checkpoint, a fresh trainer and 3 more: float64, dropout
    0.1, within 1e-12 (the same operations in the same order give the same bits)."""
    torch.manual_seed(7)
    straight = fresh(variant)
    straight_losses = straight.run(6)

    torch.manual_seed(7)
    first = fresh(variant)
    first.run(3)
    path = save(first.checkpoint(variant), checkpoint_path(tmp_path, 3))
    torch.manual_seed(12345)  # a new process would start from another RNG state
    resumed = fresh(variant)
    resumed.restore(load_checkpoint(path), variant)
    assert resumed.step == 3
    losses = resumed.run(6)

    assert losses == pytest.approx(straight_losses[3:], abs=1e-12, rel=0)
    final, expected = export_weights(resumed.model), export_weights(straight.model)
    for key in expected:
        torch.testing.assert_close(final[key], expected[key], atol=1e-12, rtol=0)


def cli_options(directory, *more: str) -> list[str]:
    return ["--variant", "einsum", "--task", "copy", "--batch", "5", "--d-model", "16", "--heads", "2",
            "--layers", "1", "--d-ff", "16", "--dropout", "0.1", "--eval-size", "16",
            "--checkpoint-dir", str(directory), *more]


def run_cli(module, argv: list[str], capsys, monkeypatch) -> list[str]:
    """``module.main(argv)``'s stdout lines (stderr, with its progress bar, swallowed)."""
    monkeypatch.setattr("sys.stderr", io.StringIO())
    module.main(argv)
    return capsys.readouterr().out.splitlines()


def test_cli_resume_continues_exactly(tmp_path, capsys, monkeypatch):
    run_cli(train_cli, cli_options(tmp_path / "straight", "--steps", "4"), capsys, monkeypatch)
    run_cli(train_cli, cli_options(tmp_path / "halves", "--steps", "2"), capsys, monkeypatch)
    resumed = run_cli(train_cli, cli_options(tmp_path / "halves", "--steps", "4", "--resume"),
                      capsys, monkeypatch)
    assert resumed[0].startswith("final loss ") and "(mean of the last 2 steps)" in resumed[0]
    straight, halves = (load_checkpoint(checkpoint_path(tmp_path / run, 4)) for run in ("straight", "halves"))
    for key, tensor in straight.weights.items():
        assert torch.equal(halves.weights[key], tensor), key
    for index, state in straight.optimizer["state"].items():
        for name, tensor in state.items():
            assert torch.equal(halves.optimizer["state"][index][name], tensor), (index, name)
    assert torch.equal(halves.rng[0]["cpu"], straight.rng[0]["cpu"])
    assert torch.equal(halves.data_rng, straight.data_rng)


def test_checkpoint_holds_the_whole_run(tmp_path):
    """Plain torch.load(weights_only=True) reads it: canonical weights, Adam, the schedule,
    the RNG states, the config, the variant and the run's settings."""
    torch.manual_seed(3)
    trainer = fresh("mathfirst")
    trainer.run(2)
    rng, data_rng = torch.get_rng_state(), trainer.batches.generator.get_state()
    raw = torch.load(save(trainer.checkpoint("mathfirst"), tmp_path / "c.pt"), weights_only=True)
    assert raw["variant"] == "mathfirst" and raw["step"] == 2 and raw["scheduler"]["last_epoch"] == 2
    assert raw["config"] == dataclasses.asdict(CONFIG)
    assert set(raw["weights"]) == set(canonical_shapes(CONFIG))
    assert len(raw["optimizer"]["state"]) == len(list(trainer.model.parameters()))
    assert torch.equal(raw["rng"][0]["cpu"], rng) and raw["rng"][0]["cuda"] is None
    assert torch.equal(raw["data_rng"], data_rng)
    assert raw["settings"] == {
        "data": dict(task="reverse", batch_size=6, vocab_size=19, min_len=1, max_len=9, seed=1),
        "recipe": dataclasses.asdict(RECIPE), "bf16": False,
    }


def test_checkpoints_are_listed_by_step(tmp_path):
    for step in (10, 9, 100):
        checkpoint_path(tmp_path, step).write_bytes(b"")
    (tmp_path / ".step-00000200.pt.1.abcd.tmp").write_bytes(b"")  # a write in progress
    (tmp_path / "average.pt").write_bytes(b"")
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "step-00000009.pt", "step-00000010.pt", "step-00000100.pt"]
    assert latest_checkpoint(tmp_path).name == "step-00000100.pt"
    with pytest.raises(ValueError, match="no checkpoint"):
        latest_checkpoint(tmp_path / "empty")


# --- refusing ------------------------------------------------------------------------------


def flip_a_weight_byte(path, weights) -> None:
    """Change one byte inside the stored generator weight: the archive still opens."""
    data = bytearray(path.read_bytes())
    at = data.find(weights["generator.weight"].numpy().tobytes()[:64])
    assert at > 0
    data[at + 5] ^= 0x40
    path.write_bytes(bytes(data))


DAMAGES = {
    "truncated": lambda path, weights: path.write_bytes(path.read_bytes()[: path.stat().st_size // 2]),
    "empty": lambda path, weights: path.write_bytes(b""),
    "flipped-byte": flip_a_weight_byte,
    "not-ours": lambda path, weights: torch.save({"state_dict": weights}, path),
    "weights-only": lambda path, weights: save(ModelFile("explicit", CONFIG, {}, weights), path),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_checkpoint_is_refused_and_files_are_untouched(damage, tmp_path):
    paths = saved_run(tmp_path, steps=(1, 2))
    DAMAGES[damage](paths[-1], load(paths[-1]).weights)
    before = files(tmp_path)
    trainer = fresh()
    weights = export_weights(trainer.model)
    with pytest.raises(ValueError, match=r"step-00000002\.pt") as error:
        trainer.restore(load_checkpoint(paths[-1]), "explicit")
    assert any(word in str(error.value) for word in ("truncated", "corrupt", "format", "model file"))
    assert files(tmp_path) == before
    assert all(torch.equal(tensor, weights[key]) for key, tensor in export_weights(trainer.model).items())
    assert trainer.step == 0


MISMATCHES = {  # what differs -> (the resuming trainer's changes, the named field)
    "variant": (dict(variant="einsum"), "variant"),
    "config": (dict(config=CONFIG.replace(dropout=0.2)), "config.dropout"),
    "shape": (dict(config=CONFIG.replace(d_ff=40)), "config.d_ff"),
    "data": (dict(batch_size=5), "settings.data.batch_size"),
    "recipe": (dict(recipe=Recipe(warmup=5, lr_factor=2.0)), "settings.recipe.lr_factor"),
}


@pytest.mark.parametrize("mismatch", MISMATCHES)
def test_checkpoint_of_another_run_is_refused(mismatch, tmp_path):
    changes, field = MISMATCHES[mismatch]
    path = saved_run(tmp_path, steps=(2,))[-1]
    before = files(tmp_path)
    trainer = fresh(**changes)
    weights, optimizer = export_weights(trainer.model), trainer.optimizer.state_dict()
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        trainer.restore(load_checkpoint(path), changes.get("variant", "explicit"))
    assert files(tmp_path) == before
    assert all(torch.equal(tensor, weights[key]) for key, tensor in export_weights(trainer.model).items())
    assert trainer.optimizer.state_dict() == optimizer and trainer.step == 0


def test_checkpoint_of_another_number_of_processes_is_refused(tmp_path):
    checkpoint = load_checkpoint(saved_run(tmp_path, steps=(2,))[-1])
    two = dataclasses.replace(checkpoint, rng=checkpoint.rng * 2)
    with pytest.raises(ValueError, match="processes: checkpoint written by 2, this run has 1"):
        fresh().restore(two, "explicit")


def test_a_crash_mid_write_leaves_the_previous_file(tmp_path, monkeypatch):
    """The file is written beside its final name and renamed into place only when complete."""
    first, second = saved_run(tmp_path, steps=(1, 2))
    second.unlink()
    before = files(tmp_path)
    checkpoint = load_checkpoint(first)

    def dies_midway(payload, file):
        file.write(b"PK\x03\x04 half an archive")
        raise OSError("no space left on device")

    monkeypatch.setattr(torch, "save", dies_midway)
    with pytest.raises(OSError, match="no space"):
        save(checkpoint, first)  # over the existing file
    with pytest.raises(OSError, match="no space"):
        save(checkpoint, second)  # a new one
    assert files(tmp_path) == before  # no half-written file, no temporary file left behind
    monkeypatch.undo()
    assert load_checkpoint(first).step == 1


@pytest.mark.parametrize("keep", [0, None])
def test_keep_checkpoints_zero_or_none_keeps_every_checkpoint(keep, tmp_path):
    settings = RunSettings("explicit", steps=3, checkpoint_dir=tmp_path, save_every=1, keep_checkpoints=keep)
    data = TaskData("copy", 4, 19, 1, 5, 0)
    trainer = run.start(settings, TaskBatches(data), CONFIG, RECIPE)
    run.run_with_checkpoints(settings, trainer)
    assert list_checkpoints(tmp_path) == [checkpoint_path(tmp_path, step) for step in (1, 2, 3)]


@pytest.mark.parametrize(("keep", "kind", "said"), [
    (-1, ValueError, "must be at least 0, got -1"), (1.5, TypeError, "must be an int, got float 1.5"),
    ("2", TypeError, "must be an int, got str '2'"), (True, TypeError, "must be an int, got bool True"),
])
def test_keep_checkpoints_that_is_not_a_count_is_refused_by_name(keep, kind, said, tmp_path):
    """Refused when the settings are made, before any run: -1 used to delete each checkpoint
    right after writing it, 1.5 and '2' to fail after the first save."""
    with pytest.raises(kind, match=rf"RunSettings\.keep_checkpoints {said}"):
        RunSettings("explicit", steps=3, checkpoint_dir=tmp_path, save_every=1, keep_checkpoints=keep)


def test_run_settings_refuse_to_resume_and_overwrite_at_once(tmp_path):
    """The checkpoints one continues, the other deletes: refused when the settings are made."""
    with pytest.raises(ValueError, match=r"RunSettings\.resume .* RunSettings\.overwrite"):
        RunSettings("explicit", steps=3, checkpoint_dir=tmp_path, resume=True, overwrite=True)


# --- averaging -----------------------------------------------------------------------------


def test_average_is_the_mean_of_canonical_tensors(tmp_path):
    paths = saved_run(tmp_path, steps=(1, 2, 3), variant="fused")
    states = [load(path).weights for path in paths]
    averaged = average_files(paths)
    assert averaged.config == CONFIG and averaged.variant == "fused"
    for key, tensor in averaged.weights.items():
        expected = (states[0][key] + states[1][key] + states[2][key]) / 3
        torch.testing.assert_close(tensor, expected, atol=1e-15, rtol=0)
    assert not torch.equal(states[0]["generator.weight"], states[2]["generator.weight"])


def test_averaging_one_checkpoint_is_the_identity(tmp_path):
    path = saved_run(tmp_path, steps=(2,), dtype=torch.float32)[-1]
    averaged = average_files([path])
    for key, tensor in load(path).weights.items():
        assert averaged.weights[key].dtype == torch.float32, key
        assert torch.equal(averaged.weights[key], tensor), key


def test_average_refuses_weights_that_do_not_match(tmp_path):
    state = {"a": torch.zeros(2), "b": torch.zeros(3)}
    with pytest.raises(ValueError, match="key b missing"):
        average_weights([state, {"a": torch.zeros(2)}])
    with pytest.raises(ValueError, match=r"key b: \(4,\)"):
        average_weights([state, {"a": torch.zeros(2), "b": torch.zeros(4)}])
    with pytest.raises(ValueError, match="nothing to average"):
        average_weights([])
    one = saved_run(tmp_path / "one", steps=(1,))
    other = saved_run(tmp_path / "other", steps=(1,), config=CONFIG.replace(dropout=0.0))
    with pytest.raises(ValueError, match="another config"):
        average_files([*one, *other])


TOKENIZER = {"kind": "marian", "source_spm": torch.arange(4, dtype=torch.uint8), "source_vocab": {"<pad>": 0},
             "target_vocab": None, "clean_up": False}  # a stored tokenizer's form: tensors, mappings, values
ONE_BAN = "the average carries one set of banned ids"


def test_average_carries_the_ban_and_the_tokenizer_and_refuses_files_that_differ(tmp_path):
    """A converted checkpoint's banned ids and tokenizer go into the average (a lost ban would
    let translate generate the padding id); files that disagree on either are refused by path."""
    def model_file(name, seed, banned=(0, 5), tokenizer=TOKENIZER):
        weights = export_weights(build("explicit", CONFIG, seed=seed))
        return save(ModelFile("explicit", CONFIG, {}, weights, tokenizer=tokenizer, banned_ids=banned),
                    tmp_path / name)

    first, second = model_file("a.pt", 0), model_file("b.pt", 1)
    averaged = load(save(average_files([first, second]), tmp_path / "average.pt"))
    assert averaged.banned_ids == (0, 5)
    assert averaged.tokenizer.keys() == TOKENIZER.keys()
    assert torch.equal(averaged.tokenizer["source_spm"], TOKENIZER["source_spm"])
    assert {key: value for key, value in averaged.tokenizer.items() if key != "source_spm"} == {
        key: value for key, value in TOKENIZER.items() if key != "source_spm"}
    fewer = model_file("c.pt", 2, banned=(5,))
    with pytest.raises(ValueError) as refused:
        average_files([first, fewer, second])
    assert str(refused.value) == f"{fewer} bans ids [5], {second} bans [0, 5]: {ONE_BAN}"
    with pytest.raises(ValueError) as refused:
        average_files([first, fewer])
    assert str(refused.value) == f"{first} bans ids [0, 5], {fewer} bans [5]: {ONE_BAN}"
    spm = torch.arange(1, 5, dtype=torch.uint8)
    other = model_file("d.pt", 3, tokenizer={**TOKENIZER, "source_spm": spm})
    none = model_file("e.pt", 4, tokenizer=None)
    for paths in ([other, first], [first, other], [none, first], [first, none]):
        with pytest.raises(ValueError) as refused:
            average_files(paths)
        assert str(refused.value) == f"{paths[0]} carries another tokenizer than {paths[1]}"


def test_averaged_model_loads_into_any_variant(tmp_path):
    averaged = average_files(saved_run(tmp_path, steps=(1, 2), variant="torch"))
    batch_in = torch.tensor([[5, 6, 7, 0]]), torch.tensor([[1, 7, 6]])
    outputs = [build_model(averaged, name).double().eval()(*batch_in, None, None)
               for name in ("torch", "explicit")]
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-10, rtol=0)


def test_average_then_decode_commands(tmp_path, capsys, monkeypatch):
    trained = run_cli(train_cli, cli_options(tmp_path, "--steps", "3", "--save-every", "1"),
                      capsys, monkeypatch)
    output = tmp_path / "average.pt"
    said = run_cli(average, ["--checkpoint-dir", str(tmp_path), "--last", "2", "--output", str(output)],
                   capsys, monkeypatch)
    assert said == [f"averaged 2 checkpoints (step-00000002.pt, step-00000003.pt) into {output}"]
    last_two = [load(checkpoint_path(tmp_path, step)).weights for step in (2, 3)]
    for key, tensor in load(output).weights.items():
        torch.testing.assert_close(tensor, (last_two[0][key] + last_two[1][key]) / 2)

    # the last checkpoint decodes as the model did at the end of training
    assert run_cli(decode, ["--model", str(checkpoint_path(tmp_path, 3)), "--eval-size", "16"],
                   capsys, monkeypatch) == trained[1:]
    shown = run_cli(decode, ["--model", str(output), "--variant", "fused", "--show", "2",
                             "--eval-size", "16"], capsys, monkeypatch)
    assert len(shown) == 3 and all(" -> " in line for line in shown[:2])
    assert shown[2].startswith("held-out exact-sequence accuracy: ") and "/16 copy sequences" in shown[2]
    with pytest.raises(SystemExit, match="--last 9 needs 9 checkpoints"):
        average.main(["--checkpoint-dir", str(tmp_path), "--last", "9", "--output", str(output)])


