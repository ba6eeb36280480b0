"""One seed, five learners (``benchmarks.studies.learners.study``,
``python -m benchmarks.studies.learners``) on the sample corpus the tests write: the records and
the table against independent counts, the rows' dropout in lockstep (and why the torch row's
masks land elsewhere), and bad options in one line."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.studies.learners import __main__ as learners_cli
from benchmarks.studies.learners import study as learners_study
from benchmarks.studies.learners.study import (
    LearnersSettings,
    as_json,
    identical_share,
    markdown_report,
    perturbed_factor,
    prepare,
    run_learners,
    run_study,
    train_learner,
)
from common.random_batch import random_batch
from common.weights import export_weights
from seq2seq.data.batches import TokenBatches
from seq2seq.data.corpus import CorpusSettings
from seq2seq.data.ids import PAD_ID
from seq2seq.pipeline import TranslationSettings
from seq2seq.training.trainer import Trainer, seed_dropout
from tests.helpers import small_config
from variants import FROM_SCRATCH, REFERENCE, VARIANTS, build

WIDE_SPLIT = dict(valid_fraction=0.2, test_fraction=0.2)
# a tiny model; translations of at most 23 pieces (an untrained model's run to the limit); a peak
# rate (0.3 * 16^-0.5 * 50^-0.5 = 0.011) at which float64 rows stay within 1e-9 of each other
# for 300 steps (at factor 1.0, warm-up 20, they part after about 50 steps: the training itself
# magnifies the last bit's differences, whatever the rows)
TINY = TranslationSettings(vocabulary_size=120, d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.1,
                           max_seq_len=24, batch_tokens=300, warmup=50, lr_factor=0.3, steps=4)
aten = torch.ops.aten


@pytest.fixture(autouse=True)
def global_rng_restored():
    """seed_dropout reseeds torch's global RNG; the tests after these get it back as it was."""
    state = torch.get_rng_state()
    yield
    torch.set_rng_state(state)


def settings_for(sample_corpus, **changes) -> LearnersSettings:
    return LearnersSettings(CorpusSettings(str(sample_corpus.path), **WIDE_SPLIT),
                            changes.pop("translation", TINY), **changes)


# --- the records and the table --------------------------------------------------------------


def test_records_and_table_against_independent_counts(sample_corpus):
    settings = settings_for(sample_corpus, variants=("explicit", REFERENCE), test_sentences=3)
    data = prepare(settings)
    saved = []
    result = run_learners(settings, data, on_row=lambda partial: saved.append(json.dumps(as_json(partial))))
    assert [len(json.loads(text)["rows"]) for text in saved] == [1, 2]  # written after each row

    # the same steps by hand: a Trainer on a fresh stream of the seed, dropout seeded alike
    stream = TokenBatches(data.train, data.stream)
    model = build("explicit", data.config, seed=0)
    seed_dropout(0)
    expected_losses = Trainer(model, stream, TINY.recipe()).run(TINY.steps)
    replay = TokenBatches(data.train, data.stream)
    targets = sum(int((next(replay)[1][:, 1:] != PAD_ID).sum()) for _ in range(TINY.steps))

    explicit, reference = result.rows
    assert explicit.losses == tuple(expected_losses)
    for row in result.rows:
        assert len(row.losses) == len(row.seconds) == TINY.steps == result.steps
        assert all(a < b for a, b in zip(row.seconds, row.seconds[1:], strict=False)) and row.seconds[0] > 0
        assert row.target_tokens == targets  # every row trained on the same batches
        assert row.tokens_per_second == targets / row.seconds[-1]
        for beam in (1, 4):
            texts = row.translations[beam]
            assert len(texts) == 3
            same = sum(a == b for a, b in zip(texts, explicit.translations[beam], strict=True))
            assert row.identical[beam] == same / 3
    assert explicit.identical == {1: 1.0, 4: 1.0}

    table = markdown_report(result).splitlines()
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
             for line in table if line.startswith("| ") and "variant" not in line}
    assert cells["explicit"][0] == "4"
    assert cells["explicit"][5] == f"{explicit.tokens_per_second:,.0f}"
    assert cells["explicit"][6] == f"{explicit.tokens_per_second / reference.tokens_per_second:.2f}x"
    assert cells[REFERENCE][6] == "1.00x"
    same_beam = sum(a == b for a, b in zip(reference.translations[4], explicit.translations[4], strict=True))
    assert cells[REFERENCE][7] == f"{same_beam / 3:.1%}"


def test_the_first_rows_steps_are_every_rows_budget(sample_corpus):
    """Under --minutes the first row stops on its clock (here the test's: 10 ms a reading,
    whatever the machine's speed); the next runs exactly as many steps."""
    settings = settings_for(sample_corpus, variants=("explicit", "fused"),
                            translation=TINY.replace(steps=10_000, minutes=0.0005))  # 30 ms
    data = prepare(settings)
    _, explicit = train_learner("explicit", data, settings, clock=itertools.count(0.0, 0.01).__next__)
    assert 1 <= len(explicit.losses) < 10 and explicit.seconds[-1] >= 0.03
    _, fused = train_learner("fused", data, settings, steps=len(explicit.losses))
    assert len(fused.losses) == len(explicit.losses)


def test_identical_share_counts_exact_matches():
    assert identical_share(("a", "b", "c", "d"), ("a", "x", "c", "d ")) == 0.5
    with pytest.raises(ValueError, match="as many translations"):
        identical_share(("a",), ("a", "b"))


# --- lockstep with dropout on -----------------------------------------------------------------


def weights_after(sample_corpus, variant: str, steps: int, dropout: float) -> dict[str, torch.Tensor]:
    settings = settings_for(sample_corpus, dtype="float64", translation=TINY.replace(dropout=dropout))
    model, _ = train_learner(variant, prepare(settings), settings, steps=steps)
    return export_weights(model)


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def test_a_few_steps_with_dropout_keep_the_from_scratch_rows_with_explicit(sample_corpus):
    explicit = weights_after(sample_corpus, "explicit", 3, dropout=0.1)
    start = export_weights(build("explicit", prepare(settings_for(sample_corpus)).config, seed=0))
    assert max_difference(explicit, start) > 1e-3  # the steps moved the weights
    for variant in FROM_SCRATCH[1:]:
        assert max_difference(weights_after(sample_corpus, variant, 3, dropout=0.1), explicit) < 1e-8, variant
    # the torch row draws its masks onto other elements (below): another sample of the training
    assert max_difference(weights_after(sample_corpus, REFERENCE, 3, dropout=0.1), explicit) > 1e-4


@pytest.mark.slow
def test_three_hundred_steps_with_dropout_keep_every_row_with_explicit(sample_corpus):
    """Float64, dropout 0.1: every from-scratch row's weights within 1e-8 of explicit's after 300
    steps (6e-10 measured); the torch row, whose masks land elsewhere, with dropout 0. About 25 s."""
    explicit = weights_after(sample_corpus, "explicit", 300, dropout=0.1)
    for variant in FROM_SCRATCH[1:]:
        moved = weights_after(sample_corpus, variant, 300, dropout=0.1)
        assert max_difference(moved, explicit) < 1e-8, variant
    without = weights_after(sample_corpus, "explicit", 300, dropout=0.0)
    assert max_difference(weights_after(sample_corpus, REFERENCE, 300, dropout=0.0), without) < 1e-8


class RecordedMasks(TorchDispatchMode):
    """Every dropout keep-mask drawn (``bernoulli_`` on CPU), as drawn from torch's generator."""

    def __init__(self) -> None:
        super().__init__()
        self.masks: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is aten.bernoulli_.float:
            self.masks.append(out.clone())
        return out


def test_the_torch_rows_masks_are_the_same_numbers_in_another_memory_order():
    """nn.MultiheadAttention computes in (L, B, D) and returns a transposed view, so the dropout
    after each attention sublayer fills its mask in (L, B, D) memory order: the numbers explicit
    puts at [b, l, d] land at [l, b, d] read as (L, B, D). Every other site matches exactly."""
    config = small_config(dropout=0.1, n_layers=1)
    batch = random_batch(config)
    masks = {}
    for variant in ("explicit", REFERENCE):
        model = build(variant, config, seed=0).double().train()
        torch.manual_seed(5)
        with RecordedMasks() as recorded:
            model(*batch.inputs())
        masks[variant] = recorded.masks
    moved = []
    for site, (ours, theirs) in enumerate(zip(masks["explicit"], masks[REFERENCE], strict=True)):
        if not torch.equal(ours, theirs):
            batch_size, length, width = ours.shape
            assert torch.equal(theirs, ours.reshape(length, batch_size, width).transpose(0, 1)), site
            moved.append(site)
    # encoder self-attention; decoder self- and cross-attention: each sublayer's output dropout
    assert moved == [2, 7, 9]


# --- the study: rounding-only controls, resume ------------------------------------------------


def test_the_perturbation_moves_the_factor_by_float32_ulps():
    # 0.7 lies in [0.5, 1): float32's spacing there is 2^-1 * 2^-23 = 2^-24; 0.3 in [0.25, 0.5): 2^-25
    assert perturbed_factor(0.7, 0) == 0.7
    assert perturbed_factor(0.7, 1) - 0.7 == 2.0 ** -24 and perturbed_factor(0.7, 3) - 0.7 == 3 * 2.0 ** -24
    assert perturbed_factor(0.3, 2) - 0.3 == 2 * 2.0 ** -25
    with pytest.raises(ValueError, match="control"):
        perturbed_factor(0.7, -1)


def test_the_controls_are_capped_where_the_rate_moves_by_less_than_a_hundredth_of_a_percent():
    """The k-th control moves the factor by k float32 ulps of its binade; relative to the factor
    that is at most k * 2^-23 (at the binade's bottom, e.g. 1.0): below 1e-4 for k <= 838, not
    for 839. Past the cap a control would change the learning rate, not only its rounding."""
    assert learners_study.MAX_CONTROLS == 838
    assert (perturbed_factor(1.0, 838) - 1.0) / 1.0 == 838 * 2.0 ** -23 < 1e-4
    assert 839 * 2.0 ** -23 > 1e-4
    assert (perturbed_factor(1.9, 838) - 1.9) / 1.9 < 1e-4  # higher in the binade: smaller still
    with pytest.raises(ValueError, match=r"control must be at most 838 .* got 839"):
        perturbed_factor(1.0, 839)


def test_a_study_of_10_to_the_18_controls_is_refused_before_any_run(sample_corpus):
    settings = settings_for(sample_corpus, variants=("explicit", "fused"))
    with pytest.raises(ValueError, match=r"controls must be at most 838 .* got 1000000000000000000"):
        run_study(settings, None, (0,), 10**18)
    with pytest.raises(ValueError, match=r"seed must be a seed in 0\.\.4294967295"):
        run_study(settings, None, (2**64,), 1)


def trained_weights(data, settings, factor: float) -> dict[str, torch.Tensor]:
    run = LearnersSettings(settings.corpus, settings.translation.replace(lr_factor=factor),
                           variants=settings.variants)
    model, learning = train_learner("explicit", data, run, steps=6)
    return export_weights(model), learning.losses


def test_a_control_differs_from_its_row_only_in_rounding(sample_corpus):
    settings = settings_for(sample_corpus, variants=("explicit",))
    data = prepare(settings)
    plain, plain_losses = trained_weights(data, settings, TINY.lr_factor)
    again, again_losses = trained_weights(data, settings, perturbed_factor(TINY.lr_factor, 0))
    assert again_losses == plain_losses  # perturbation off: bit-identical
    assert all(torch.equal(again[n], plain[n]) for n in plain)
    moved, moved_losses = trained_weights(data, settings, perturbed_factor(TINY.lr_factor, 1))
    assert moved_losses[0] == plain_losses[0]  # before any step: the same to the bit
    assert any(not torch.equal(moved[n], plain[n]) for n in plain)  # the perturbation was applied
    # ...and it is rounding: the losses agree to float32's. (The weights are no bound: the key
    # biases' gradients are rounding noise, which Adam scales to full-size steps either way.)
    for ours, theirs in zip(moved_losses, plain_losses, strict=True):
        assert abs(ours - theirs) <= 1e-5 * abs(theirs)


def test_the_study_records_every_run_and_resumes_the_missing_ones(sample_corpus, monkeypatch):
    settings = settings_for(sample_corpus, variants=("explicit", "fused"), test_sentences=2,
                            translation=TINY.replace(steps=2))
    data = prepare(settings)
    trained = []
    train = learners_study.train_learner

    def counted(variant, run_data, run_settings, steps, on_step=None):
        trained.append((variant, run_settings.seed, run_settings.translation.lr_factor, run_data.stream.seed))
        return train(variant, run_data, run_settings, steps, on_step)

    monkeypatch.setattr(learners_study, "train_learner", counted)
    saved = []
    records = run_study(settings, data, (0, 1), 1, on_run=lambda rs: saved.append(len(rs)))
    keys = [(r["variant"], r["seed"], r["control"]) for r in records]
    assert keys == [("explicit", 0, 0), ("explicit", 0, 1), ("fused", 0, 0), ("fused", 0, 1),
                    ("explicit", 1, 0), ("explicit", 1, 1), ("fused", 1, 0), ("fused", 1, 1)]
    assert saved == list(range(1, 9))  # written after every run
    step = 2.0 ** -25  # TINY's factor 0.3 lies in [0.25, 0.5)
    assert [t[2] for t in trained[:2]] == [0.3, 0.3 + step]
    assert all(t[1] == t[3] for t in trained)  # each seed sets weights and batches
    assert all(len(r["losses"]) == 2 and set(r["bleu"]) == {"1", "4"} for r in records)
    assert json.loads(json.dumps(records)) == records  # plain JSON

    # interrupted after 5 runs: only the 3 missing ones run again, the 5 are kept as they were
    trained.clear()
    resumed = run_study(settings, data, (0, 1), 1, done=tuple(records[:5]))
    assert [(t[0], t[1]) for t in trained] == [("explicit", 1), ("fused", 1), ("fused", 1)]
    assert resumed[:5] == records[:5] and len(resumed) == 8
    assert [r["losses"] for r in resumed[5:]] == [r["losses"] for r in records[5:]]  # the same runs, redone
    trained.clear()
    assert run_study(settings, data, (0, 1), 1, done=tuple(records)) == records and trained == []


def test_the_study_takes_its_budget_in_steps(sample_corpus):
    settings = settings_for(sample_corpus, translation=TINY.replace(minutes=1.0))
    with pytest.raises(ValueError, match="budget is steps"):
        run_study(settings, None, (0,), 1)


def test_the_study_command_resumes_and_prints_the_statistic(sample_corpus, tmp_path, capsys, monkeypatch):
    out = tmp_path / "study"
    argv = ["--data", str(sample_corpus.path), "--out", str(out), "--steps", "2", "--seeds", "0",
            "--controls", "1", "--variants", "explicit", "fused", "--vocab", "120", "--d-model", "16",
            "--heads", "2", "--layers", "1", "--d-ff", "32", "--batch-tokens", "300",
            "--test-sentences", "2", "--threads", "1"]
    learners_cli.main(argv)
    saved = json.loads((out / "study.json").read_text())
    assert len(saved["runs"]) == 4 and "between rows" in capsys.readouterr().out
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    pixels = imread(out / "study.png")[..., :3]
    assert ((pixels.max(-1) - pixels.min(-1)) > 0.3).mean() > 0.002  # coloured curves drawn
    saved["runs"] = saved["runs"][:3]
    (out / "study.json").write_text(json.dumps(saved))
    trained = []
    train = learners_study.train_learner
    monkeypatch.setattr(learners_study, "train_learner",
                        lambda variant, *rest: trained.append(variant) or train(variant, *rest))
    learners_cli.main(argv)
    assert trained == ["fused"] and len(json.loads((out / "study.json").read_text())["runs"]) == 4
    with pytest.raises(SystemExit) as exit_info:  # other settings in the same --out
        learners_cli.main([*argv[:-2], "--threads", "1", "--dropout", "0.2"])
    assert "recorded with other settings (translation)" in str(exit_info.value)


# --- the command line -----------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "said"), [
    (["--variants", "torch", "explicit"], "must start with explicit"),
    (["--variants", "explicit", "nope"], "unknown 'nope'"),
    (["--variants", "explicit", "fused", "fused"], "names a row twice"),
    (["--steps", "0"], "--steps: must be positive"),
    (["--minutes", "-1"], "--minutes: must be positive"),
    (["--dtype", "float16"], "--dtype: invalid choice"),
    (["--d-model", "30", "--heads", "4"], "d_model (30) must be divisible"),
    (["--test-sentences", "0"], "--test-sentences: must be positive"),
    (["--seeds", "0", "1", "--minutes", "2"], "takes its budget in --steps"),
    (["--controls", "2"], "takes its budget in --steps"),
    (["--seeds", "0", "0", "--steps", "5"], "names a seed twice"),
    (["--controls", "-1", "--steps", "5"], "--controls: must be at least 0"),
    (["--seeds", str(2**64), "--steps", "5"], "--seeds: must be a seed in 0..4294967295"),
    (["--seeds", "0", "-1", "--steps", "5"], "--seeds: must be a seed in 0..4294967295"),
    (["--seed", str(2**32)], "--seed: must be a seed in 0..4294967295"),
    (["--controls", str(10**18), "--steps", "5"], "--controls must be at most 838 (rounding only: "),
    (["--controls", "100000", "--steps", "5"], "got 100000"),
    (["--seeds", "3", "--steps", "5"], "the study needs at least two runs of each row"),
])
def test_bad_options_fail_in_one_line(sample_corpus, tmp_path, capsys, argv, said):
    with pytest.raises(SystemExit) as exit_info:
        learners_cli.parse_args(["--data", str(sample_corpus.path), "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert said in err and "error:" in err, err


@pytest.mark.parametrize(("argv", "taken"), [(["--seeds", "0", "1", "--steps", "2"], "study.json"),
                                             (["--seeds", "0", "1", "--steps", "2"], "study.png"),
                                             (["--steps", "2"], "learners.json"),
                                             (["--steps", "2"], "learners.png")])
def test_a_result_file_that_is_a_directory_is_refused_before_training(sample_corpus, tmp_path, monkeypatch,
                                                                      capsys, argv, taken):
    """The results are written after each run and at the end: a folder in a result file's place
    would fail only then, the training done lost. Refused before the corpus is read."""
    (tmp_path / taken).mkdir()
    monkeypatch.setattr(learners_study, "prepare", lambda *a, **k: pytest.fail("prepared"))
    monkeypatch.setattr(learners_study, "train_learner", lambda *a, **k: pytest.fail("trained"))
    with pytest.raises(SystemExit) as stop:
        learners_cli.main(["--data", str(sample_corpus.path), "--out", str(tmp_path),
                           "--variants", "explicit", "fused", *argv])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"--out {tmp_path}: {taken} is a directory, not a file" in line, line


def test_a_missing_corpus_and_an_unwritable_out_fail_in_one_line(sample_corpus, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    for argv, said in ([["--data", str(tmp_path / "nowhere.zip"), "--out", str(tmp_path)], "no such file"],
                       [["--data", str(sample_corpus.path), "--out", str(tmp_path / "file" / "x")], "--out"]):
        with pytest.raises(SystemExit):
            learners_cli.parse_args(argv)
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and said in err, err


def test_a_corpus_the_length_filter_empties_says_so(sample_corpus):
    """Every pair longer than max_seq_len: the message names the filter, not the batches' "got
    0 and 0"."""
    with pytest.raises(ValueError, match=r"every training pair is longer than max_seq_len 3 pieces .*"
                                         r"the length filter left none: a smaller --max-words"):
        prepare(settings_for(sample_corpus, translation=TINY.replace(max_seq_len=3)))


def test_the_options_become_the_settings(sample_corpus, tmp_path):
    _, settings = learners_cli.parse_args(["--data", str(sample_corpus.path), "--out", str(tmp_path),
                                           "--minutes", "2", "--d-model", "64", "--variants", "explicit",
                                           "torch", "--dtype", "float64"])
    assert settings.translation.minutes == 2.0 and settings.translation.d_model == 64
    assert settings.translation.n_heads == 4  # the cpu preset's
    assert settings.variants == ("explicit", "torch") and settings.dtype == "float64"
    _, default = learners_cli.parse_args(["--data", str(sample_corpus.path), "--out", str(tmp_path)])
    assert default.variants == VARIANTS and default.translation.minutes == 30.0  # the preset's


@pytest.mark.slow
def test_the_command_writes_json_table_and_picture(sample_corpus, tmp_path):
    """Two rows of 30 steps end to end; the picture is a real PNG with coloured lines."""
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    out = tmp_path / "run"
    learners_cli.main(["--data", str(sample_corpus.path), "--out", str(out), "--steps", "30",
                       "--variants", "explicit", "fused", "--vocab", "120", "--d-model", "16",
                       "--heads", "2", "--layers", "1", "--d-ff", "32", "--batch-tokens", "300",
                       "--test-sentences", "3", "--threads", "1"])
    report = json.loads((out / "learners.json").read_text())
    assert [row["variant"] for row in report["rows"]] == ["explicit", "fused"]
    assert all(len(row["losses"]) == 30 and math.isfinite(row["valid_loss"]) for row in report["rows"])
    assert "| fused" in (out / "learners.md").read_text()
    pixels = imread(out / "learners.png")[..., :3]
    assert ((pixels.max(-1) - pixels.min(-1)) > 0.3).mean() > 0.002  # coloured curves drawn
