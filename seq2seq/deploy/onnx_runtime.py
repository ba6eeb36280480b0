"""ONNX Runtime: the suite's encoder, cached decoder step and generator exported to ONNX from the
canonical weights, and run as ONNX Runtime sessions behind the interface the decoders use.

    export_onnx(model, "onnx-model")                 # any row's weights
    engine = OnnxRuntimeModel("onnx-model")           # or precision="int8"
    tokens = greedy_decode(engine, src, padding_mask(src, pad_id), max_len=20, bos_id=1, eos_id=2)
    best = beam_search(engine, src, padding_mask(src, pad_id), bos_id=1, eos_id=2)

Four graphs, one per stage of the interface's incremental decoding (common/interface.py):

    encoder    src (B, S), src_mask (B, 1, 1, S)                  -> memory (B, S, D)
    start      memory (B, S, D)                                   -> per layer cross K, V (B, S, D)
    step       token (B, 1), src_mask, tgt_mask (B, 1, 1, t + 1),
               per layer past self K, V (B, t, D), cross K, V     -> hidden (B, 1, D),
                                                                     per layer self K, V (B, t + 1, D)
    generator  hidden (B, 1, D)                                   -> log-probs (B, 1, V)

Batch, source length and past length are dynamic. The graphs are traced from the ``fused``
variant holding the exported weights (its stages ``_encode``, ``_start_cache``,
``_decode_step``, ``_project``). The default exporter is torch 2.13's own,
``torch.onnx.export(dynamo=True)`` (torch.export, then onnxscript): the step's position is the
past keys' symbolic length, and the path is the supported one. ``exporter="torchscript"`` is
the legacy tracer, deprecated in torch 2.9 and slated for removal, which gives the same graphs'
function (the tests prove both) about ten times faster; it records the position through
traced shape ops. ``OnnxRuntimeModel`` gives the sessions the interface that
seq2seq.search.strategy.NextToken steps (``encode``, ``start_cache``, ``decode_step``, ``project``), so
greedy decoding and beam search are the suite's own code, unchanged.

Shape legend:
    B  batch (or batch x beams)   S  source length   t  positions decoded so far
    D  model dim                  V  target vocabulary
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

try:
    import onnxruntime
    from onnxruntime.quantization import QuantType, quantize_dynamic
except ImportError as error:  # the optional extra
    raise ImportError(
        'seq2seq.deploy.onnx_runtime needs onnxruntime, onnx and onnxscript: pip install -e ".[deploy]"'
    ) from error
import numpy as np
import torch
from torch import Tensor, nn

from common import checks
from common.cache import batch_first, type_and_shape
from common.config import TransformerConfig
from common.masks import target_padding_mask
from common.weights import export_weights, import_weights
from seq2seq.deploy.export_config import check_model, check_source_ids, load_config, save_config
from variants import build

GRAPHS = ("encoder", "start", "step", "generator")
PRECISIONS = ("float32", "int8")  # int8: ONNX Runtime's dynamic quantization of the matrices


def layer_names(config: TransformerConfig, prefix: str) -> list[str]:
    """The step's per-layer key/value names, in input order: self K, self V, cross K, cross V."""
    return [
        f"{prefix}_{kind}_{i}"
        for i in range(config.n_layers)
        for kind in ("self_key", "self_value", "cross_key", "cross_value")
    ]


class _Encoder(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor, src_mask: Tensor) -> Tensor:
        return self.model.export_encode(src, src_mask)  # (B, S, D)


class _Start(_Encoder):
    def forward(self, memory: Tensor) -> list[Tensor]:
        layers = self.model.export_start_cache(memory)
        return [t for layer in layers for t in (layer.cross_keys, layer.cross_values)]  # 2 x (B, S, D) each


class _Step(_Encoder):
    def forward(self, token: Tensor, src_mask: Tensor, tgt_mask: Tensor, past: list[Tensor]) -> list[Tensor]:
        layers = [self.model.export_layer_cache(*past[i : i + 4]) for i in range(0, len(past), 4)]
        position = past[0].shape[1]  # symbolic: the past keys' length
        hidden = self.model.export_decode_step(token, position, layers, src_mask, tgt_mask)  # (B, 1, D)
        return [hidden, *(t for layer in layers for t in (layer.self_keys, layer.self_values))]


class _Generator(_Encoder):
    def forward(self, hidden: Tensor) -> Tensor:
        return self.model.export_project(hidden)  # (B, 1, V)


EXPORTERS = ("dynamo", "torchscript")


def export_onnx(model: nn.Module, directory: str | Path, *, exporter: str = "dynamo") -> Path:
    """Export ``model``'s weights (any row's) as the four graphs, float32, into ``directory``, with
    the suite's config beside them. The dynamo exporter takes several seconds per graph.

    Anything but a model of this suite is a ``TypeError``, an unknown ``exporter`` a
    ``ValueError``, both before anything is written."""
    config = check_model(model)
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    if exporter == "dynamo":
        try:  # torch.onnx's dynamo exporter imports it only when it runs
            import onnxscript  # noqa: F401
        except ImportError as error:
            raise ImportError(
                'the dynamo ONNX exporter needs onnxscript: pip install -e ".[deploy]"'
            ) from error
    fused = build("fused", config)
    import_weights(fused, export_weights(model))
    fused.eval()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    batch, src_len, past_len, d_model = 2, 3, 2, config.d_model
    B, S = torch.export.Dim("batch"), torch.export.Dim("src_len", max=config.max_seq_len)
    T = torch.export.Dim("past_len", max=config.max_seq_len - 1)
    src = torch.ones(batch, src_len, dtype=torch.long)
    src_mask = torch.ones(batch, 1, 1, src_len, dtype=torch.bool)
    memory = torch.zeros(batch, src_len, d_model)
    past = [
        torch.zeros(batch, length, d_model)
        for _ in range(config.n_layers)
        for length in (past_len, past_len, src_len, src_len)
    ]
    past_shapes = [{0: B, 1: dim} for _ in range(config.n_layers) for dim in (T, T, S, S)]
    src_mask_shape = {0: B, 3: S}
    graphs = {
        "encoder": (
            _Encoder(fused),
            (src, src_mask),
            ({0: B, 1: S}, src_mask_shape),
            ["src", "src_mask"],
            ["memory"],
        ),
        "start": (
            _Start(fused),
            (memory,),
            ({0: B, 1: S},),
            ["memory"],
            [n for n in layer_names(config, "present") if "cross" in n],
        ),
        "step": (
            _Step(fused),
            (
                torch.ones(batch, 1, dtype=torch.long),
                src_mask,
                torch.ones(batch, 1, 1, past_len + 1, dtype=torch.bool),
                past,
            ),
            ({0: B}, src_mask_shape, {0: B, 3: T + 1}, past_shapes),
            ["token", "src_mask", "tgt_mask", *layer_names(config, "past")],
            ["hidden", *(n for n in layer_names(config, "present") if "self" in n)],
        ),
        "generator": (
            _Generator(fused),
            (torch.zeros(batch, 2, d_model),),
            ({0: B, 1: torch.export.Dim("length")},),
            ["hidden"],
            ["log_probs"],
        ),
    }
    for name, (module, args, shapes, inputs, outputs) in graphs.items():
        path = directory / f"{name}.onnx"
        # notes on merged axis names, the legacy exporter's deprecation, the exporter's log lines
        # about torchvision's operators (not installed, not used)
        with warnings.catch_warnings(), quiet_logger("torch.onnx"):
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                program = torch.onnx.export(
                    module.eval(),
                    args,
                    dynamic_shapes=shapes,
                    input_names=inputs,
                    output_names=outputs,
                    dynamo=True,
                    verbose=False,
                )
                program.save(str(path))
            else:
                torch.onnx.export(
                    module.eval(),
                    args,
                    str(path),
                    input_names=inputs,
                    output_names=outputs,
                    dynamic_axes=named_axes(shapes, inputs),
                    dynamo=False,
                )
    save_config(config, directory)
    return directory


def named_axes(shapes: tuple, inputs: list[str]) -> dict[str, dict[int, str]]:
    """torch.export's dynamic shapes as the legacy exporter's ``dynamic_axes``, by input name."""
    flat = [shape for group in shapes for shape in (group if isinstance(group, list) else [group])]
    return {
        name: {axis: str(dim) for axis, dim in shape.items()}
        for name, shape in zip(inputs, flat, strict=True)
    }


@contextlib.contextmanager
def quiet_logger(name: str | None) -> Iterator[None]:
    """Only errors from logger ``name`` (None: the root logger) while the block runs."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def quantize_int8(directory: str | Path) -> None:
    """Beside each graph, ``<graph>.int8.onnx``: ONNX Runtime's dynamic quantization (int8 weights
    of every MatMul, activations quantized per call).

    The weights use 7 of their 8 bits (``reduce_range``): on a CPU without VNNI instructions
    (AVX2 alone) ONNX Runtime multiplies uint8 activations by int8 weights in pairs whose int16
    sums saturate with full-range weights, which moved the tests' small model's log-probs by up to
    1.05 (a third of its argmaxes changed); with 7-bit weights, 0.06 and none changed."""
    directory = Path(directory)
    with quiet_logger(None):  # its advice to pre-process, logged on the root logger
        for name in GRAPHS:
            quantize_dynamic(
                directory / f"{name}.onnx", directory / f"{name}.int8.onnx", weight_type=QuantType.QInt8,
                reduce_range=True,
            )


class OnnxCache:
    """A decode's state between ONNX Runtime steps, as ``common.cache.DecoderCache`` holds it for
    a variant: per layer the keys and values (numpy, (B, t, D) and (B, S, D)), the source mask
    and the ids so far; ``reorder`` follows beam search's surviving rows."""

    def __init__(self, self_kv: list[np.ndarray], cross_kv: list[np.ndarray], src_mask: Tensor) -> None:
        self.self_kv = self_kv  # per layer: key, value (B, t, D)
        self.cross_kv = cross_kv  # per layer: key, value (B, S, D)
        self.src_mask = src_mask  # (B, 1, 1, S) bool
        self.tokens = torch.empty(src_mask.shape[0], 0, dtype=torch.long)  # (B, t)

    @property
    def length(self) -> int:
        return self.tokens.shape[1]

    def past(self) -> list[np.ndarray]:
        """The step's key/value inputs in ``layer_names`` order."""
        return [
            a
            for i in range(0, len(self.self_kv), 2)
            for a in (*self.self_kv[i : i + 2], *self.cross_kv[i : i + 2])
        ]

    def reorder(self, origin: Tensor) -> None:
        """Row i continues old row ``origin[i]`` (repeats allowed)."""
        index = origin.numpy()
        self.self_kv = [a.take(index, axis=0) for a in self.self_kv]
        self.cross_kv = [a.take(index, axis=0) for a in self.cross_kv]
        self.src_mask = self.src_mask.index_select(0, origin)
        self.tokens = self.tokens.index_select(0, origin)


class OnnxRuntimeModel(nn.Module):
    """The exported graphs as ONNX Runtime sessions behind the incremental-decoding interface.

    ``encode``, ``start_cache``, ``decode_step`` and ``project`` check what they are given as the
    interface does, then run their session; ``decode`` (full recompute) is not exported, so
    decode with ``use_cache=True``, the default. Float32 on the CPU.
    """

    has_cache = True

    def __init__(self, directory: str | Path, *, precision: str = "float32", threads: int = 1) -> None:
        super().__init__()
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        checks.check_int("threads", threads, low=1)
        self.config = load_config(directory)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        suffix = ".int8.onnx" if precision == "int8" else ".onnx"
        paths = {name: Path(directory) / f"{name}{suffix}" for name in GRAPHS}
        missing = [str(path) for path in paths.values() if not path.is_file()]
        if missing:
            hint = " (make them with quantize_int8)" if precision == "int8" else ""
            raise ValueError(f"{directory} lacks {', '.join(missing)}{hint}")
        self.sessions = {
            name: onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            for name, path in paths.items()
        }
        self.precision = precision
        self.directory = Path(directory)
        self.step_inputs = ["token", "src_mask", "tgt_mask", *layer_names(self.config, "past")]

    def _src_mask(self, src_mask: Tensor | None, batch: int, src_len: int) -> Tensor:
        """The suite's source mask as the graphs take it, (B, 1, 1, S) bool."""
        checks.check_mask(
            "src_mask", src_mask, (batch, self.config.n_heads, 1, src_len), torch.device("cpu")
        )
        if src_mask is None:
            return torch.ones(batch, 1, 1, src_len, dtype=torch.bool)
        src_mask = batch_first(src_mask, batch)  # (B, 1 | H, 1, S)
        if src_mask.shape[1] != 1:
            raise ValueError(
                f"src_mask must be the same for every head, (B, 1, 1, S), got {tuple(src_mask.shape)}"
            )
        return src_mask.expand(batch, 1, 1, src_len).contiguous()

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """(B, S) source ids -> (B, S, D) memory."""
        check_source_ids(self.config, src)
        mask = self._src_mask(src_mask, *src.shape)
        (memory,) = self.sessions["encoder"].run(None, {"src": src.long().numpy(), "src_mask": mask.numpy()})
        return torch.from_numpy(memory)

    def decode(self, *args, **kwargs) -> Tensor:
        raise NotImplementedError(
            "OnnxRuntimeModel has no full-recompute decode graph: decode with "
            "use_cache=True (the default of greedy_decode and beam_search)"
        )

    def start_cache(self, memory: Tensor, src_mask: Tensor | None = None) -> OnnxCache:
        """(B, S, D) memory -> a cache holding each decoder layer's cross-attention keys and values."""
        if (
            not isinstance(memory, Tensor)
            or memory.ndim != 3
            or memory.shape[2] != self.config.d_model
            or memory.dtype != torch.float32
        ):
            raise ValueError(
                f"memory must be a float32 (B, S, D={self.config.d_model}) tensor, "
                f"got {type_and_shape(memory)}"
            )
        batch, src_len, _ = memory.shape
        mask = self._src_mask(src_mask, batch, src_len)
        cross = self.sessions["start"].run(None, {"memory": memory.numpy()})
        empty = np.zeros((batch, 0, self.config.d_model), dtype=np.float32)  # (B, 0, D)
        return OnnxCache([empty] * (2 * self.config.n_layers), cross, mask)

    def decode_step(self, tgt: Tensor, cache: OnnxCache) -> Tensor:
        """(B, 1) ids at the next position t -> (B, 1, D); the cache grows by one position."""
        if not isinstance(cache, OnnxCache):
            raise TypeError(f"cache must come from this model's start_cache, got {type(cache).__name__}")
        if not isinstance(tgt, Tensor) or tuple(tgt.shape) != (cache.tokens.shape[0], 1):
            raise ValueError(
                f"tgt must hold one new id per cached row, shape (B={cache.tokens.shape[0]}, 1), "
                f"got {type_and_shape(tgt)}"
            )
        if cache.length >= self.config.max_seq_len:
            raise ValueError(
                f"decode_step at position {cache.length} is past max_seq_len {self.config.max_seq_len}"
            )
        checks.check_ids("tgt", tgt, self.config.tgt_vocab_size, "tgt_vocab_size", 1, torch.device("cpu"))
        tokens = torch.cat([cache.tokens, tgt.long()], dim=1)  # (B, t + 1)
        tgt_mask = target_padding_mask(tokens, self.config.pad_id)  # (B, 1, 1, t + 1), as decode_step
        feeds = dict(
            zip(
                self.step_inputs,
                [tgt.long().numpy(), cache.src_mask.numpy(), tgt_mask.numpy(), *cache.past()],
                strict=True,
            )
        )
        hidden, *present = self.sessions["step"].run(None, feeds)
        cache.self_kv, cache.tokens = present, tokens
        return torch.from_numpy(hidden)

    def project(self, hidden: Tensor) -> Tensor:
        """(B, T, D) hidden states -> (B, T, V) log-probabilities."""
        if (not isinstance(hidden, Tensor) or hidden.ndim != 3 or hidden.shape[2] != self.config.d_model
                or hidden.dtype != torch.float32):
            raise ValueError(f"hidden must be a float32 (B, T, D={self.config.d_model}) tensor, "
                             f"got {type_and_shape(hidden)}")
        (log_probs,) = self.sessions["generator"].run(None, {"hidden": hidden.contiguous().numpy()})
        return torch.from_numpy(log_probs)
