"""Decode rows for the deployment engines, ONNX Runtime and CTranslate2 (float32 and int8, and
CTranslate2's bfloat16 types where its build runs them on this CPU), and for plain PyTorch's fast
path beside them (``seq2seq.fast.static_search``): "inductor", fused's static step compiled with
inductor freezing (float32); "onednn", the same step eager and flat (``seq2seq.fast.flat``: one
function over the decoder's weights, attention by two matrix products) with its linears on oneDNN
(``seq2seq.fast.onednn``), on weights packed in float32 and, as a row of its own, in bfloat16;
"int8", the flat step with its linears on int8 weights and int8 products
(``seq2seq.fast.int8``: fbgemm's dynamic quantization, x86). All three take greedy's argmax over
the logits. And the implementation people run: "hf-marian",
Hugging Face's ``MarianMTModel`` holding the same weights (``seq2seq.hub.from_hf.marian_model``;
a config it can compute, such as ``--preset opus-mt-base``), whose row times the forward
(logits, then log_softmax) as well as ``generate``'s greedy decoding and beam search (beam 4,
its own length penalty 1.0).

    rows = engine_rows(model, batch, max_len=65, directory=tmp, threads=2)
    for row in rows:                      # "onnxruntime float32", ..., "ctranslate2 int8"
        ids = row.steps["decode"]()       # (B, L) ids, as benchmarks.compare.steps.decode_step returns

For one model's weights (any row's), one padded batch and ``max_len`` ids per row (BOS
included), each ``EngineRow`` holds the calls a variant row's decode columns time: "decode",
cached greedy decoding, and "beam", beam search of ``seq2seq.search.beam.BEAM_SIZE``. ONNX Runtime's
are the suite's own greedy_decode and beam_search driving the sessions
(``seq2seq.deploy.onnx_runtime``), so its beam is the suite's; CTranslate2's beam is its own
search, with its own length penalty (docs/deployment.md). Exporting is done here, once, before
any timing; the calls then only decode. int8 is ONNX Runtime's dynamic quantization,
CTranslate2's ``compute_type="int8"``, and the int8 row's ``seq2seq.fast.int8`` (its engine is
its precision, so its label is "int8" alone). CTranslate2 decodes in a process of its own
(``benchmarks.engines.isolated``): in this one, its OpenMP threads would slow every torch row timed after
it. The fast-path rows hold fused with the same weights; the inductor row's first calls, which
compile, are its compile time (``EngineRow.compiles``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from benchmarks.compare.steps import beam_step, decode_step
from benchmarks.engines.isolated import Isolated
from common.config import TransformerConfig
from common.random_batch import Batch
from common.weights import export_weights, transfer
from seq2seq.data.ids import BOS_ID, timing_eos_id
from seq2seq.fast.int8 import int8_available, with_int8_linears
from seq2seq.fast.onednn import packable_dtypes
from seq2seq.fast.static_search import StaticBeam, StaticGreedy
from seq2seq.hub.from_hf import marian_model, marian_problem
from seq2seq.search.beam import ALPHA, BEAM_SIZE
from variants import build, variant_argument

if TYPE_CHECKING:  # the deploy extra is imported only when its rows are asked for
    from seq2seq.deploy.ctranslate import CTranslate2Model

ENGINES = ("onnxruntime", "ctranslate2", "inductor", "onednn", "int8", "hf-marian")
# each fast-path row's StaticGreedy/StaticBeam options; the int8 row's decoders step on a copy
FAST_PATHS = {"inductor": dict(compile_mode="default", freezing=True), "onednn": dict(onednn=True, flat=True),
              "int8": dict(flat=True)}
PRECISIONS = ("float32", "int8", "bfloat16", "int8_bfloat16")
# the precisions each engine offers; CTranslate2's and oneDNN's are asked of them (``offered``)
OFFERED = {"onnxruntime": ("float32", "int8"), "inductor": ("float32",), "int8": ("int8",),
           "hf-marian": ("float32",)}
ENGINE_MODES = ("decode", "beam")  # the decode modes an engine row has (no full-recompute decode)
# the modules each engine needs, and the extra that installs them (pip install -e ".[deploy]")
ENGINE_MODULES = {"onnxruntime": ("onnx", "onnxscript", "onnxruntime"), "ctranslate2": ("ctranslate2",),
                  "inductor": (), "onednn": (), "int8": (), "hf-marian": ("transformers",)}
ENGINE_EXTRAS = {"hf-marian": "hf"}  # the others': deploy


def row_argument(text: str) -> str:
    """An argparse ``type`` for compare.py's rows: a deployment engine or a variant name or spec."""
    return text if text in ENGINES else variant_argument(text)


def engines_problem(engines: tuple[str, ...], decode_len: int, *, device: str = "cpu",
                    dtypes: tuple[str, ...] = ("float32",), autocast: bool = False,
                    config: TransformerConfig | None = None) -> str | None:
    """Why compare.py cannot time these engine rows (nothing to decode, no CPU float32 block
    for them to join, an extra missing, or, for hf-marian, a ``config`` MarianMTModel cannot
    compute), or None; checked before any work."""
    if not engines:
        return None
    if "hf-marian" in engines and config is not None and (problem := marian_problem(config)):
        return f"the hf-marian row: {problem}"
    if "int8" in engines and not int8_available():
        return ("the int8 row runs PyTorch's fbgemm quantized engine (x86 CPUs), which this build lacks: "
                f"it has {', '.join(torch.backends.quantized.supported_engines)}")
    rows = f"the {', '.join(engines)} rows"
    if decode_len == 1:
        return f"{rows} time decoding only: give --decode-len above 1"
    if device == "cuda" or "float32" not in dtypes or autocast:
        return (f"{rows} join CPU float32 blocks only (their reduced precision is their int8 row): "
                "give --dtype float32 without --autocast, on --device cpu or all")
    return missing_extra(engines)


def offered(engine: str) -> tuple[str, ...]:
    """The precisions ``engine``'s rows run on this CPU: CTranslate2's those its build runs here
    (``ctranslate2.get_supported_compute_types``), oneDNN's float32 and, where it has bfloat16
    kernels, bfloat16 (``seq2seq.fast.onednn.packable_dtypes``); the others' fixed (int8's is
    int8, refused up front where fbgemm is missing: ``engines_problem``)."""
    if engine == "ctranslate2":
        from seq2seq.deploy.ctranslate import supported_compute_types

        return tuple(precision for precision in PRECISIONS if precision in supported_compute_types())
    if engine == "onednn":
        return tuple(str(dtype).removeprefix("torch.") for dtype in packable_dtypes())
    return OFFERED[engine]


def missing_extra(engines: tuple[str, ...]) -> str | None:
    """Why the ``engines`` rows cannot run here (a module of the deploy extra missing), or None."""
    missing = {engine: [module for module in ENGINE_MODULES[engine]
                        if importlib.util.find_spec(module) is None] for engine in engines}
    missing = {engine: modules for engine, modules in missing.items() if modules}
    if not missing:
        return None
    extras = ",".join(dict.fromkeys(ENGINE_EXTRAS.get(engine, "deploy") for engine in missing))
    return (f"the {', '.join(missing)} rows need {', '.join(m for ms in missing.values() for m in ms)}: "
            f'pip install -e ".[{extras}]"')


@dataclass(frozen=True)
class EngineRow:
    """One engine at one precision: its timed decode calls."""

    engine: str  # one of ENGINES
    precision: str  # one of PRECISIONS
    steps: dict[str, Callable[[], Tensor]]  # mode in ENGINE_MODES -> a call returning (B, L) ids
    compiles: bool = False  # whether its first calls compile (their time is its compile time)

    @property
    def label(self) -> str:
        """The row's name in a table: engine and precision, or the engine alone where it is its
        precision ("int8")."""
        return self.engine if self.engine == self.precision else f"{self.engine} {self.precision}"


@dataclass(frozen=True)
class EngineSettings:
    """Which engine rows to build and how they run."""

    engines: tuple[str, ...] = ENGINES  # which of ENGINES
    precisions: tuple[str, ...] = PRECISIONS  # which of PRECISIONS
    threads: int = 1  # intra-op threads of each session / translator (the variants' torch threads)
    exporter: str = "dynamo"  # torch.onnx exporter: "dynamo" (supported) or "torchscript" (faster)

    def __post_init__(self) -> None:
        for name, chosen, known in (
            ("engines", self.engines, ENGINES),
            ("precisions", self.precisions, PRECISIONS),
        ):
            unknown = [value for value in chosen if value not in known]
            if unknown or not chosen:
                raise ValueError(f"EngineSettings.{name} must be a non-empty subset of {known}, got {chosen}")
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(f"EngineSettings.threads must be a positive int, got {self.threads!r}")


def engine_rows(
    model: nn.Module,
    batch: Batch,
    max_len: int,
    directory: str | Path,
    settings: EngineSettings = EngineSettings(),
) -> list[EngineRow]:
    """Export ``model``'s weights under ``directory`` and build every requested engine row."""
    directory = Path(directory)
    rows = []
    if "onnxruntime" in settings.engines:
        from seq2seq.deploy import onnx_runtime

        exported = onnx_runtime.export_onnx(model, directory / "onnx", exporter=settings.exporter)
        if "int8" in settings.precisions:
            onnx_runtime.quantize_int8(exported)
        for precision in (p for p in settings.precisions if p in offered("onnxruntime")):
            engine = onnx_runtime.OnnxRuntimeModel(exported, precision=precision, threads=settings.threads)
            rows.append(
                EngineRow(
                    "onnxruntime",
                    precision,
                    {
                        "decode": decode_step(engine, batch, max_len),
                        "beam": beam_step(engine, batch, max_len),
                    },
                )
            )
    if "ctranslate2" in settings.engines:
        from seq2seq.deploy import ctranslate

        exported = ctranslate.export_ctranslate2(
            model, directory / "ctranslate2", bos_id=BOS_ID, eos_id=timing_eos_id(model.config)
        )
        for precision in (p for p in settings.precisions if p in offered("ctranslate2")):
            # in a process of its own: in this one its OpenMP threads would slow torch's rows
            engine = Isolated(ctranslate.CTranslate2Model, exported, compute_type=precision,
                              threads=settings.threads)
            rows.append(EngineRow("ctranslate2", precision, ctranslate2_steps(engine, batch, max_len)))
    for engine, levers in FAST_PATHS.items():
        if engine not in settings.engines:
            continue
        for precision in (p for p in settings.precisions if p in offered(engine)):
            weights = dict(onednn_dtype=getattr(torch, precision)) if engine == "onednn" else {}
            steps = fast_path_steps(model, batch, max_len, levers | weights, int8=engine == "int8")
            rows.append(EngineRow(engine, precision, steps, compiles="compile_mode" in levers))
    if "hf-marian" in settings.engines and "float32" in settings.precisions:
        rows.append(EngineRow("hf-marian", "float32", hf_marian_steps(model, batch, max_len)))
    return rows


def hf_marian_steps(model: nn.Module, batch: Batch, max_len: int) -> dict[str, Callable[[], Tensor]]:
    """Hugging Face's MarianMTModel holding ``model``'s weights (float32, eval, its default
    attention): its forward's log-probs, and ``generate``'s greedy decoding and beam search
    (beam 4, ``length_penalty`` 1.0, its default) from BOS to the timing EOS, ``max_len`` ids at
    most, nothing forbidden and no forced EOS; with the key/value cache."""
    config = model.config
    eos = timing_eos_id(config)
    hf = marian_model(config, export_weights(model), start_id=BOS_ID, eos_id=eos).to(batch.src.device)
    attention = (batch.src != config.pad_id).long()  # (B, S): 1 at real source ids
    tgt = batch.inputs()[1]  # (B, T) target ids, BOS first
    tgt_attention = (tgt != config.pad_id).long()  # (B, T): padded target keys hidden, as the rows hide them
    search = dict(input_ids=batch.src, attention_mask=attention, max_length=max_len, do_sample=False,
                  decoder_start_token_id=BOS_ID, eos_token_id=eos, pad_token_id=config.pad_id,
                  forced_eos_token_id=None, bad_words_ids=None, use_cache=True)

    @torch.no_grad()
    def forward() -> Tensor:
        logits = hf(input_ids=batch.src, attention_mask=attention, decoder_input_ids=tgt,
                    decoder_attention_mask=tgt_attention, use_cache=False).logits
        return torch.log_softmax(logits, dim=-1)

    return {"forward": forward,
            "decode": lambda: hf.generate(**search, num_beams=1),
            "beam": lambda: hf.generate(**search, num_beams=BEAM_SIZE, length_penalty=1.0)}


def fast_path_steps(model: nn.Module, batch: Batch, max_len: int,
                    levers: dict, *, int8: bool = False) -> dict[str, Callable[[], Tensor]]:
    """Greedy decoding and beam search (beam 4, alpha 0.6) on fused's static step under
    ``levers`` (``StaticGreedy``'s options, ``onednn_dtype`` among them), fused holding
    ``model``'s weights in float32, or with ``int8`` its copy on int8 linears
    (``seq2seq.fast.int8``); with a compile mode, each call after the first decodes on the
    compiled graph."""
    fast = build("fused", model.config)
    transfer(model, fast)
    fast = fast.to(device=batch.src.device, dtype=torch.float32).eval()
    if int8:
        fast = with_int8_linears(fast)
    ids = dict(max_len=max_len, bos_id=BOS_ID, eos_id=timing_eos_id(model.config), **levers)
    greedy, beam = StaticGreedy(fast, **ids), StaticBeam(fast, beam_size=BEAM_SIZE, alpha=ALPHA, **ids)
    return {"decode": lambda: greedy(batch.src, batch.src_mask),
            "beam": lambda: beam(batch.src, batch.src_mask).tokens}


def ctranslate2_steps(
    engine: CTranslate2Model | Isolated, batch: Batch, max_len: int
) -> dict[str, Callable[[], Tensor]]:
    """CTranslate2's greedy decoding and its beam search (beam 4, alpha 0.6 in its own penalty),
    in this process or in its own (``benchmarks.engines.isolated``)."""
    src = batch.src.cpu()
    return {
        "decode": lambda: engine.greedy(src, max_len=max_len),
        "beam": lambda: engine.beam(src, max_len=max_len, beam_size=BEAM_SIZE, alpha=ALPHA).tokens,
    }
