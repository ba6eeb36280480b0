"""compare.py end to end on its tiny preset, its refusal of bad options, and the measuring
library behind it (benchmarks/): the FLOP formula and the batch every row runs on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.compare.failures import failure_cell
from benchmarks.compare.ratios import paired_ratio, round_orders
from benchmarks.compare.render import render
from benchmarks.compare.run import run
from benchmarks.compare.settings import Settings
from benchmarks.compare.workload import TIMING_PRESETS, Shape, forward_flops
from common.config import TransformerConfig
from common.random_batch import random_batch
from compare import main, parse_args
from seq2seq.data.ids import BOS_ID, timing_eos_id
from variants import REFERENCE, VARIANTS, build

ROOT = Path(__file__).resolve().parents[3]
# one thread: the suite shares its cores with other processes, and OpenMP's second thread
# then waits on a busy core at every op; a short run per cell keeps the test fast
FAST = ["--preset", "tiny", "--rounds", "1", "--min-run-time", "0.02", "--threads", "1",
        "--decode-len", "4", "--quiet"]


def run_compare(*options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "compare.py", *options], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def compare_in_process(capsys, *options: str) -> str:
    """compare.py's main in this process (no interpreter start-up), glibc's allocator left as it
    is; what it printed to stdout."""
    assert main([*options, "--malloc", "default"]) == 0
    return capsys.readouterr().out


# compare.py's whole default table in a fresh interpreter, tiny preset (about 15 s): what the
# tests reading it check is the output's shape, which the in-process tests below also reach
TINY_REPORT = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_report() -> dict:
    done = run_compare(*FAST, "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@TINY_REPORT
def test_tiny_preset_has_one_row_per_variant_with_positive_times(tiny_report):
    (block,) = tiny_report["blocks"]
    assert [row["variant"] for row in block["rows"]] == list(VARIANTS)
    for row in block["rows"]:
        for key in ("forward_ms", "train_ms", "decode_tokens_per_s", "forward_gflops",
                    "train_peak_mb"):
            assert row[key] is not None and row[key] > 0, (row["variant"], key, row[key])
    assert block["matmul_peak_gflops"] > 0


# The agreement column at torch.testing.assert_close's float32 defaults (atol 1e-5, rtol
# 1.3e-6), docs/architecture.md's promise: a row's largest |Δ log p| within atol alone passes assert_close
# at every position (the rtol term only adds room), so it is the bound on the column.
FLOAT32_ATOL = 1e-5


@TINY_REPORT
def test_tiny_preset_agrees_with_torch_after_weight_transfer(tiny_report):
    (block,) = tiny_report["blocks"]
    for row in block["rows"]:
        if row["variant"] != REFERENCE:  # the reference row is the expected value, not a subject
            assert row["max_abs_dlogp"] is not None and row["max_abs_dlogp"] <= FLOAT32_ATOL, row["variant"]
    reference = next(row for row in block["rows"] if row["variant"] == REFERENCE)
    assert reference["max_abs_dlogp"] == 0.0
    assert reference["forward_vs_torch"] == pytest.approx(1.0)


@TINY_REPORT
def test_torch_row_reports_its_eval_fast_path(tiny_report):
    """nn.Transformer takes its fused eval kernels here (even heads, no autocast, no_grad)."""
    fast_path = {row["variant"]: row["torch_fast_path"] for row in tiny_report["blocks"][0]["rows"]}
    assert fast_path == {name: name == "torch" for name in VARIANTS}


@pytest.mark.slow  # a compare.py run (about 3 s)
def test_torch_fast_path_can_be_turned_off(capsys):
    out = compare_in_process(capsys, *FAST, "--variants", "torch", "--no-torch-fast-path",
                             "--format", "json")
    (row,) = json.loads(out)["blocks"][0]["rows"]
    assert row["torch_fast_path"] is False and row["forward_ms"] > 0


@TINY_REPORT
def test_header_names_machine_and_settings(tiny_report):
    meta = tiny_report["meta"]
    assert meta["threads"] == 1
    assert meta["torch"] == torch.__version__
    assert meta["cpu_model"]
    assert tiny_report["blocks"][0]["dtype"] == "float32"


@pytest.mark.slow  # a compare.py run of two rows (about 5 s); the tiny report's tests cover the rest
def test_table_format_prints_one_table_with_a_header_line(capsys):
    lines = without_warning(compare_in_process(capsys, *FAST, "--variants", "explicit", "torch",
                                               "--format", "simple")).splitlines()
    assert lines[0].startswith("cpu: ") and "· 1 thread ·" in lines[0] and "torch " in lines[0]
    body = [line.split()[0] for line in lines[1:] if line.split()]
    assert "explicit" in body and "torch" in body and "einsum" not in body


@pytest.mark.slow  # a full compare.py run over two shapes (about 5 s)
def test_several_lengths_give_one_block_per_shape(tmp_path, capsys):
    output = tmp_path / "run.csv"
    compare_in_process(capsys, *FAST, "--variants", "torch", "--batch", "2", "3", "--src-len", "8",
                       "12", "--tgt-len", "6", "--format", "csv", "--output", str(output))
    lines = output.read_text().splitlines()
    assert lines[0].startswith("device,dtype,batch,src_len,tgt_len,variant")
    assert [line.split(",")[:5] for line in lines[1:]] == [
        ["cpu", "float32", "2", "8", "6"], ["cpu", "float32", "3", "12", "6"]]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--variants", "nosuch"], "nosuch"),
        (["--batch", "0"], "--batch"),
        (["--batch", "-3"], "--batch"),
        (["--src-len", "0"], "--src-len"),
        (["--tgt-len", "two"], "--tgt-len"),
        (["--src-len", "129"], "length 129 exceeds max_seq_len 128"),
        (["--src-len", "129", "--max-seq-len", "100"], "length 129 exceeds max_seq_len 100"),
        (["--decode-len", "200"], "--decode-len 200 exceeds max_seq_len 128"),
        (["--max-seq-len", "0"], "--max-seq-len"),
        (["--batch", "1", "2", "--src-len", "4", "5", "6"], "pair up"),
        (["--dtype", "float8"], "float8"),
        (["--dropout", "1.5"], "TransformerConfig.dropout"),
        (["--min-run-time", "0"], "--min-run-time"),
        (["--format", "nosuch"], "--format"),
        (["--freeze"], "--freeze"),
        # seeds: numpy refuses negative ones, torch's generator those past 2**64 - 1
        (["--seed", "-1"], "--seed"),
        (["--seed", str(2**64)], "--seed"),
        (["--seed", str(2**32)], "0..4294967295"),
        (["--seed", "1.5"], "--seed"),
        (["--rounds", "0"], "--rounds"),
    ],
)
def test_bad_option_exits_2_with_one_line(options, named, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--preset", "tiny", *options])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("compare.py: error: ") and named in line


@pytest.mark.slow
def test_compile_reports_compile_time_and_speed_up_over_eager_of_a_correct_model():
    """--compile --freeze on one variant: the compiled forward still agrees with the eager
    reference, and the eager steps timed alongside give a speed-up for each mode."""
    done = run_compare(*FAST, "--variants", "explicit", "--compile", "--freeze", "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["meta"]["compile"] and report["meta"]["freeze"]
    (row,) = report["blocks"][0]["rows"]
    assert row["compile_s"] > 0
    assert row["forward_compile_speedup"] > 0 and row["train_compile_speedup"] > 0
    assert row["max_abs_dlogp"] <= FLOAT32_ATOL


def test_max_seq_len_lets_a_preset_run_longer_sequences():
    settings, _ = parse_args(["--preset", "tiny", "--max-seq-len", "300", "--src-len", "260",
                              "--tgt-len", "3", "--batch", "1", "--decode-len", "1"])
    assert settings.config == TransformerConfig(**TIMING_PRESETS["tiny"].fields).replace(max_seq_len=300)
    assert settings.shapes == (Shape(1, 260, 3),)
    model = build("explicit", settings.config, seed=0).eval()
    logp = model(*random_batch(settings.config, *settings.shapes[0]).inputs())
    assert logp.shape == (1, 3, settings.config.tgt_vocab_size) and torch.isfinite(logp).all()


@pytest.mark.slow  # a fresh interpreter; the in-process bad-option tests above run by default
def test_bad_option_from_the_shell_is_one_line_and_no_traceback():
    done = run_compare("--preset", "tiny", "--batch", "0")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "compare.py: error: argument --batch: must be positive, got '0' (see --help)"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_exits_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--device", "cuda"])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--device cuda: CUDA is not available" in line


def test_flop_formula_counts_every_matmul():
    """One layer each, D=2, F=3, V=5, S=7, T=11, B=2, counted by hand from the formula's terms."""
    config = TransformerConfig(d_model=2, n_heads=1, n_layers=1, d_ff=3, src_vocab_size=5,
                               tgt_vocab_size=5, max_seq_len=16)
    d, f, v, s, t = 2, 3, 5, 7, 11
    encoder = 2 * (4 * s * d * d) + 2 * (2 * s * s * d) + 2 * (2 * s * d * f)
    self_attn = 2 * (4 * t * d * d) + 2 * (2 * t * t * d)
    cross_attn = 2 * (2 * t * d * d) + 2 * (2 * s * d * d) + 2 * (2 * t * s * d)
    decoder = self_attn + cross_attn + 2 * (2 * t * d * f)
    assert forward_flops(config, 2, s, t) == 2 * (encoder + decoder + 2 * t * d * v)


def test_flop_formula_grows_with_each_dimension():
    config = TransformerConfig(d_model=64, n_heads=4, n_layers=2, d_ff=256, src_vocab_size=100,
                               tgt_vocab_size=100, max_seq_len=64)
    one = forward_flops(config, 1, 16, 16)
    assert forward_flops(config, 3, 16, 16) == 3 * one
    assert forward_flops(config.replace(n_layers=4), 1, 16, 16) > one
    assert forward_flops(config, 1, 32, 16) > one


def test_batch_is_padded_but_no_attention_row_is_fully_masked():
    config = TransformerConfig(d_model=8, n_heads=2, n_layers=1, d_ff=16, src_vocab_size=50,
                               tgt_vocab_size=40, max_seq_len=64)
    batch = random_batch(config, 16, 20, 12, seed=3)
    assert (batch.src == config.pad_id).any()  # padding is exercised
    assert batch.src[0].ne(config.pad_id).all() and batch.tgt[0].ne(config.pad_id).all()
    assert batch.src_mask.any(dim=-1).all()  # every source keeps a real key
    assert batch.tgt_mask.any(dim=-1).all()  # every target query sees a real key
    assert (batch.labels == config.pad_id).equal(batch.tgt == config.pad_id)
    assert int(batch.tgt.max()) < config.tgt_vocab_size and int(batch.src.max()) < config.src_vocab_size


def without_warning(text: str) -> str:
    """The rendered report less its first lines when they warn of busy cores (the suite shares
    its machine: others may hold every core while it runs)."""
    first, _, rest = text.partition("\n\n")
    return rest if first.startswith("warning: ") else text


def tiny_settings(**changes) -> Settings:
    """The library called directly: one small block, one short round, no progress bar."""
    fields = dict(config=TransformerConfig(**TIMING_PRESETS["tiny"].fields), shapes=(Shape(2, 8, 6),),
                  preset="tiny", rounds=1, min_run_time=0.01, decode_len=1, threads=1,
                  keep_freed_memory=False, show_progress=False)
    return Settings(**{**fields, **changes})


@pytest.mark.parametrize(("field", "value", "error"), [
    ("seed", -1, ValueError), ("seed", 2**32, ValueError), ("seed", 2**64, ValueError),
    ("seed", 1.5, TypeError), ("seed", True, TypeError), ("order_seed", -1, ValueError),
    ("rounds", 0, ValueError), ("rounds", -1, ValueError), ("rounds", 2.0, TypeError),
])
def test_settings_refuse_a_seed_or_rounds_no_run_could_use(field, value, error):
    """Refused when made, naming the field, not after the whole run has been timed."""
    with pytest.raises(error, match=f"Settings.{field}"):
        tiny_settings(**{field: value})


@pytest.mark.parametrize("seed", [0, 2**32 - 1])
def test_the_seed_range_is_one_every_consumer_of_the_seed_takes(seed):
    """compare.py's bounds, through everything the seed reaches: the weights, the batch, the
    rounds' orders and the intervals' resampling."""
    settings, _ = parse_args(["--preset", "tiny", "--seed", str(seed)])
    assert settings.seed == seed
    config = TransformerConfig(**TIMING_PRESETS["tiny"].fields)
    build(REFERENCE, config, seed=seed)
    random_batch(config, 2, 3, 3, seed=seed)
    assert len(round_orders(["explicit", "torch"], 2, seed)) == 2
    assert paired_ratio([1.0, 1.2, 1.1], [1.0, 1.0, 1.0], seed=seed).low is not None
    tiny_settings(seed=seed, order_seed=seed)


@pytest.mark.slow  # seconds: a child process, a compile or a full run; CI runs it with -m slow
def test_library_run_times_only_the_chosen_variants_and_restores_the_process():
    threads, fast_path = torch.get_num_threads(), torch.backends.mha.get_fastpath_enabled()
    report = run(tiny_settings(variants=("explicit",), torch_fast_path=False))
    assert torch.get_num_threads() == threads
    assert torch.backends.mha.get_fastpath_enabled() == fast_path
    (block,) = report["blocks"]
    assert (block["batch"], block["src_len"], block["tgt_len"]) == (2, 8, 6)
    (row,) = block["rows"]
    assert row["variant"] == "explicit" and row["forward_ms"] > 0 and row["train_ms"] > 0
    assert row["max_abs_dlogp"] <= FLOAT32_ATOL  # checked against the reference, built but not timed
    assert row["forward_vs_torch"] is None  # ...so there is no time to compare with
    assert "decode_tokens_per_s" not in row  # decode_len 1 skips decoding
    assert report["meta"]["threads"] == 1 and report["meta"]["preset"] == "tiny"


def test_settings_modes_follow_decode_and_compile():
    assert tiny_settings().modes == ("forward", "train")
    assert tiny_settings(decode_len=4, compile=True).modes == (
        "forward", "train", "decode", "forward_eager", "train_eager")


def test_failed_cells_read_oom_or_error_and_the_error_is_noted_under_the_table():
    assert failure_cell(torch.OutOfMemoryError("CUDA out of memory.")) == "OOM"
    assert failure_cell(RuntimeError("DefaultCPUAllocator: can't allocate memory")) == "OOM"
    assert failure_cell(ValueError("bad mask\nand more")) == "ValueError: bad mask"
    rows = [{"variant": "explicit", "params": 10**6, "forward_error": "OOM", "train_error": None,
             "train_ms": 2.0, "train_iqr_ms": 0.25, "dlogp_error": None},
            {"variant": "torch", "params": 10**6, "forward_error": "ValueError: bad mask",
             "train_error": None, "dlogp_error": None, "torch_fast_path": False}]
    meta = {"cpu_model": "cpu", "threads": 1, "torch": "x", "autocast": False, "compile": False,
            "preset": "tiny", "decode_len": 1, "allocator": "glibc default"}
    block = {"device": "cpu", "dtype": "float32", "batch": 2, "src_len": 8, "tgt_len": 6,
             "matmul_peak_gflops": 100.0, "rows": rows}
    text = render({"meta": meta, "blocks": [block]}, "plain")
    explicit, torch_row = (next(line.split() for line in text.splitlines() if line.startswith(name))
                           for name in ("explicit", "torch "))
    assert explicit[1:4] == ["OOM", "-", "2.0"]  # fwd ms, fwd ×torch, train ms
    assert torch_row[1] == "error"
    wide = render({"meta": meta, "blocks": [block]}, "plain", wide=True)
    explicit = next(line.split() for line in wide.splitlines() if line.startswith("explicit"))
    assert explicit[2:5] == ["OOM", "2.0", "(0.2)"]  # fwd ms (IQR), train ms (IQR)
    assert "  torch forward: ValueError: bad mask" in text.splitlines()
    assert "explicit forward:" not in text  # an OOM is said in its cell only


# --- the decode columns ----------------------------------------------------------------------


def test_all_decoders_times_every_decoder_beside_cached_greedy_and_wide_only_widens():
    assert parse_args(["--preset", "tiny", "--all-decoders"])[0].all_decoders
    assert not parse_args(["--preset", "tiny"])[0].all_decoders
    assert not parse_args(["--preset", "tiny", "--wide"])[0].all_decoders  # more columns, same work
    assert tiny_settings(decode_len=4, all_decoders=True).modes == (
        "forward", "train", "decode", "decode_uncached", "beam")
    assert tiny_settings(decode_len=1, all_decoders=True).modes == ("forward", "train")


@pytest.mark.slow  # every decoder of two rows timed (about 5 s)
def test_decode_columns_rates_ratios_and_cache_bytes():
    """Cached greedy, greedy by full recompute and beam 4 per row; the cache's bytes per token
    by the formula (a key and a value of d_model floats per decoder layer); torch has no cache."""
    settings = tiny_settings(variants=("explicit", "torch"), decode_len=4, all_decoders=True)
    report = run(settings)
    rows = {row["variant"]: row for row in report["blocks"][0]["rows"]}
    config = settings.config
    for row in rows.values():
        for key in ("decode_tokens_per_s", "decode_uncached_tokens_per_s", "beam_tokens_per_s",
                    "decode_cache_speedup", "decode_vs_torch", "beam_step_vs_greedy"):
            assert row[key] is not None and row[key] > 0, (row["variant"], key)
    assert rows["explicit"]["cache_bytes_per_token"] == 2 * config.d_model * config.n_layers * 4
    assert rows["explicit"]["cache_cross_bytes"] == 2 * 8 * config.d_model * config.n_layers * 4  # S=8
    assert rows["torch"]["cache_bytes_per_token"] is None
    assert rows["torch"]["decode_vs_torch"] == pytest.approx(1.0)
    wide = titles(render(report, "plain", wide=True))
    assert "uncached tok/s" in wide and "beam-4 tok/s" in wide and "cache KiB/token" in wide
    assert "uncached tok/s" not in titles(render(report, "plain"))  # not in the compact table
    report["meta"]["all_decoders"] = False
    narrow = titles(render(report, "plain", wide=True))
    assert "decode tok/s" in narrow and "uncached tok/s" not in narrow


def test_decoding_ends_at_the_last_target_id():
    config = TransformerConfig(**TIMING_PRESETS["tiny"].fields)  # 1000 target ids
    assert timing_eos_id(config) == 999
    assert timing_eos_id(config.replace(tgt_vocab_size=40, src_vocab_size=40)) == 39
    assert timing_eos_id(config) != BOS_ID and config.pad_id not in (BOS_ID, timing_eos_id(config))


def titles(text: str) -> str:
    """The column titles' line of a rendered table."""
    return next(line for line in text.splitlines() if line.lstrip("| ").startswith("variant"))


# --- the compact default table and the SDPA kernel each row ran -------------------------------

COMPACT_TITLES = ["variant", "fwd ms", "fwd ×torch", "train ms", "train ×torch", "decode tok/s",
                  "decode ×fused", "peak MB", "max Δ logp"]


@TINY_REPORT
def test_the_default_table_fits_120_characters_and_wide_shows_every_column(tiny_report):
    compact = render(tiny_report, "github")
    table = [line for line in compact.splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(VARIANTS)
    assert [title.strip() for title in table[0].strip("|").split("|")] == COMPACT_TITLES
    assert max(map(len, compact.splitlines())) <= 120, compact
    wide = titles(render(tiny_report, "github", wide=True))
    for title in ("params M", "fwd ms (IQR)", "train tok/s", "fwd GFLOP/s", "train % peak", "fwd peak MB",
                  "fwd vs torch", "decode vs fused"):
        assert title in wide and title not in table[0], title


@TINY_REPORT
def test_the_header_gives_the_matmul_peak_with_its_spread(tiny_report):
    (block,) = tiny_report["blocks"]
    header = without_warning(render(tiny_report, "github")).splitlines()[1]
    assert f"matmul peak {block['matmul_peak_gflops']:,.0f} GFLOP/s (IQR " in header
    assert len(block["matmul_peak_rounds_gflops"]) == tiny_report["meta"]["rounds"]
    assert block["matmul_peak_gflops"] == max(block["matmul_peak_by_shape_gflops"].values())


@TINY_REPORT
def test_the_fused_row_names_its_sdpa_kernel_and_a_from_scratch_row_none(tiny_report):
    rows = {row["variant"]: row for row in tiny_report["blocks"][0]["rows"]}
    assert rows["fused"]["sdpa_backend"] and rows["fused"]["sdpa_backend_train"]
    assert rows["explicit"]["sdpa_backend"] is None and rows["explicit"]["sdpa_backend_train"] is None
    note = next(line for line in render(tiny_report, "github").splitlines() if "SDPA kernel" in line)
    assert f"fused forward {rows['fused']['sdpa_backend']}" in note and "explicit" not in note


def test_a_table_that_cannot_be_written_goes_to_stdout_with_the_reason(tmp_path, capsys):
    """The output path is checked before timing; if writing still fails at the end (here: the
    path became a directory), the measured table is not lost."""
    from benchmarks.compare.render import write_table

    assert write_table("| table |\n", str(tmp_path / "run.md")) is None
    assert (tmp_path / "run.md").read_text() == "| table |\n" and capsys.readouterr().out == ""
    problem = write_table("| table |\n", str(tmp_path))
    assert problem.startswith(f"cannot write {tmp_path} (") and "on stdout instead" in problem
    assert capsys.readouterr().out == "| table |\n"
