"""CTranslate2: a model spec built from the canonical weights, saved, and decoded by
``ctranslate2.Translator``; results come back in the suite's layout.

    export_ctranslate2(model, "ct2-model", bos_id=1, eos_id=V - 1)
    engine = CTranslate2Model("ct2-model", compute_type="int8")
    tokens = engine.greedy(src, max_len=20)            # (B, L), as seq2seq.search.greedy.greedy_decode
    best = engine.beam(src, max_len=20, alpha=0.6)     # Hypotheses: tokens (B, L), scores (B,)

Ids become the token strings ``"<id>"``. What the spec sets explicitly, because CTranslate2's
defaults differ from the suite's function:

- the sinusoid table of common/positions.py (CTranslate2's own concatenates sines then cosines);
- the final LayerNorm after each stack (``final_norm``; without it, none: ``no_final_norm`` in
  pre-norm, nothing added in post-norm) in post-norm too: ``TransformerEncoderSpec`` and
  ``TransformerDecoderSpec`` declare it only for pre-norm (no declared field asks for it in
  post-norm: ``no_final_norm`` only removes it, ``pre_post_layer_norm`` adds a norm to every
  layer), but the runtime applies a ``layer_norm`` it finds in the model in both modes, so it is
  set on the frozen spec. That is CTranslate2's behaviour, not its promise: pyproject.toml bounds
  it below 5, and tests/seq2seq/deploy/test_engines.py fails loudly if a release declares the field or
  stops taking it;
- ``layer_norm_epsilon`` = config.norm_eps (the runtime's own default is 1e-5);
- the decoder's start token (``decoder_start_token``, ``"<s>"`` by default) = BOS;
- at decode time: ``min_decoding_length=0`` (default 1 forbids EOS at the first step) and
  ``max_input_length=0`` (default 1024 truncates); ``return_end_token`` to tell EOS from the
  length limit.

Beam search differs from seq2seq.search.beam in its length penalty and its stopping rule: a
hypothesis scores log P / |Y|^alpha (|Y| the generated ids, EOS included), not
GNMT's ((5 + |Y|) / 6)^alpha, and the search runs until ``beam_size`` hypotheses have finished.
``beam`` returns CTranslate2's best hypothesis and its own score (docs/deployment.md).

Shape legend:
    B  batch    S  source length    L  decoded length, BOS included    V  target vocabulary
"""

from __future__ import annotations

import json
from pathlib import Path

try:
    import ctranslate2
    from ctranslate2.specs import attention_spec, common_spec
    from ctranslate2.specs import transformer_spec as specs
except ImportError as error:  # the optional extra
    raise ImportError('seq2seq.deploy.ctranslate needs ctranslate2: pip install -e ".[deploy]"') from error
import numpy as np
import torch
from torch import Tensor, nn

from common.checks import check_int, check_number
from common.config import TransformerConfig
from common.positions import sinusoid_table
from common.weights import export_weights
from seq2seq.deploy.export_config import check_source_ids, load_config, real_lengths, save_config
from seq2seq.search.beam import Hypotheses
from seq2seq.search.strategy import check_arguments

# the precisions a decode row may ask for: the weights' own, int8, and bfloat16 where the CPU has it
COMPUTE_TYPES = ("float32", "int8", "bfloat16", "int8_bfloat16")
# config fields for checkpoints trained elsewhere that this export has no proof for: only their
# defaults (the paper's architecture) are exported
UNSERVED_FIELDS = ("activation", "positions", "decoder_d_ff", "decoder_start")


def token(index: int) -> str:
    """The token string CTranslate2 knows id ``index`` by."""
    return f"<{index}>"


def _numpy(weights: dict[str, Tensor]) -> dict[str, np.ndarray]:
    return {name: tensor.detach().float().cpu().numpy() for name, tensor in weights.items()}


def _linear(spec: common_spec.LinearSpec, w: dict[str, np.ndarray], *names: str) -> None:
    """Canonical (out, in) matrices and biases, stacked as the row blocks of one projection."""
    spec.weight = np.concatenate([w[f"{name}.weight"] for name in names])
    spec.bias = np.concatenate([w[f"{name}.bias"] for name in names])


def _norm(spec: common_spec.LayerNormSpec, w: dict[str, np.ndarray], name: str) -> None:
    spec.gamma, spec.beta = w[f"{name}.weight"], w[f"{name}.bias"]


def _with_final_norm(
    stack: specs.TransformerEncoderSpec | specs.TransformerDecoderSpec, config: TransformerConfig
) -> None:
    """The spec declares a stack's final norm only for pre-norm; the runtime applies one it finds
    in the model in both modes, so post-norm gets it too (as torch.nn.Transformer has it), where
    the config has one."""
    if config.final_norm and not config.norm_first:
        object.__setattr__(stack, "layer_norm", common_spec.LayerNormSpec())


def _self_attention(spec: attention_spec.MultiHeadAttentionSpec, w: dict[str, np.ndarray], at: str) -> None:
    """A layer's self-attention: fused Q, K, V rows, the output projection, and norm1 after it."""
    _linear(spec.linear[0], w, *(f"{at}.self_attn.{p}" for p in ("wq", "wk", "wv")))
    _linear(spec.linear[1], w, f"{at}.self_attn.wo")
    _norm(spec.layer_norm, w, f"{at}.norm1")


def _feed_forward(spec: specs.FeedForwardSpec, w: dict[str, np.ndarray], at: str, norm: str) -> None:
    """A layer's feed-forward network and the norm that follows it (norm2 encoder, norm3 decoder)."""
    _linear(spec.linear_0, w, f"{at}.ff.w1")
    _linear(spec.linear_1, w, f"{at}.ff.w2")
    _norm(spec.layer_norm, w, f"{at}.{norm}")


def encoder_spec(weights: dict[str, Tensor], config: TransformerConfig) -> specs.TransformerEncoderSpec:
    """The encoder stack of the canonical weights: embeddings, positions, layers, final norm."""
    w = _numpy({name: t for name, t in weights.items() if name.startswith(("src_embed", "encoder."))})
    encoder = specs.TransformerEncoderSpec(config.n_layers, config.n_heads, pre_norm=config.norm_first,
                                           no_final_norm=not config.final_norm)
    _with_final_norm(encoder, config)
    encoder.embeddings[0].weight = w["src_embed.weight"]  # scaled by sqrt(D): scale_embeddings
    encoder.position_encodings.encodings = _positions(config)
    for i, layer in enumerate(encoder.layer):
        _self_attention(layer.self_attention, w, f"encoder.layers.{i}")
        _feed_forward(layer.ffn, w, f"encoder.layers.{i}", "norm2")
    if config.final_norm:
        _norm(encoder.layer_norm, w, "encoder.norm")
    return encoder


def decoder_spec(weights: dict[str, Tensor], config: TransformerConfig) -> specs.TransformerDecoderSpec:
    """The decoder stack of the canonical weights, and the generator as its output projection."""
    w = _numpy(
        {name: t for name, t in weights.items() if name.startswith(("tgt_embed", "decoder.", "generator"))}
    )
    decoder = specs.TransformerDecoderSpec(config.n_layers, config.n_heads, pre_norm=config.norm_first,
                                           no_final_norm=not config.final_norm)
    _with_final_norm(decoder, config)
    decoder.embeddings.weight = w["tgt_embed.weight"]
    decoder.position_encodings.encodings = _positions(config)
    for i, layer in enumerate(decoder.layer):
        at = f"decoder.layers.{i}"
        _self_attention(layer.self_attention, w, at)
        _linear(layer.attention.linear[0], w, f"{at}.cross_attn.wq")
        _linear(layer.attention.linear[1], w, f"{at}.cross_attn.wk", f"{at}.cross_attn.wv")  # fused K, V rows
        _linear(layer.attention.linear[2], w, f"{at}.cross_attn.wo")
        _norm(layer.attention.layer_norm, w, f"{at}.norm2")
        _feed_forward(layer.ffn, w, at, "norm3")
    if config.final_norm:
        _norm(decoder.layer_norm, w, "decoder.norm")
    _linear(decoder.projection, w, "generator")  # tied or not, the generator's own (V, D) matrix
    return decoder


def _positions(config: TransformerConfig) -> np.ndarray:
    """The suite's sinusoid table, float32 (max_seq_len, D): CTranslate2's own differs in layout."""
    return sinusoid_table(config.max_seq_len, config.d_model).float().numpy()


def transformer_spec(
    weights: dict[str, Tensor], config: TransformerConfig, *, bos_id: int, eos_id: int
) -> specs.TransformerSpec:
    """The canonical weights as a CTranslate2 ``TransformerSpec``, checked complete."""
    spec = specs.TransformerSpec(encoder_spec(weights, config), decoder_spec(weights, config))
    spec.register_source_vocabulary([token(i) for i in range(config.src_vocab_size)])
    spec.register_target_vocabulary([token(i) for i in range(config.tgt_vocab_size)])
    spec.config.bos_token = spec.config.decoder_start_token = token(bos_id)
    spec.config.eos_token = token(eos_id)
    spec.config.unk_token = token(config.pad_id)  # never produced: every id has its token
    spec.config.layer_norm_epsilon = config.norm_eps
    spec.validate()
    return spec


def export_ctranslate2(model: nn.Module, directory: str | Path, *, bos_id: int, eos_id: int,
                       overwrite: bool = False) -> Path:
    """Save ``model``'s weights (any row's) as a float32 CTranslate2 model in ``directory``, with the
    suite's config beside them; int8 is chosen when loading (``CTranslate2Model(compute_type=)``).

    A directory that already holds files is refused unless ``overwrite`` (as CTranslate2's own
    converters refuse without ``force``): an export written over another would mix two models."""
    directory = Path(directory)
    if not overwrite and directory.is_dir() and any(directory.iterdir()):
        raise FileExistsError(f"{directory} already holds files; pass overwrite=True to write over them")
    config = check_arguments(model, None, 1, bos_id, eos_id, True)
    default = TransformerConfig()
    unserved = [f"{name}={getattr(config, name)!r}" for name in UNSERVED_FIELDS
                if getattr(config, name) != getattr(default, name)]
    if unserved:
        raise ValueError(f"export_ctranslate2 exports the paper's architecture only; this model has "
                         f"{', '.join(unserved)}: decode it with the suite's search, or export it to "
                         "ONNX (seq2seq.deploy.onnx_runtime)")
    weights = export_weights(model)
    for name, tensor in weights.items():  # the ONNX exporter refuses them too
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"weight {name} holds NaN or inf: nothing to export")
    spec = transformer_spec(weights, config, bos_id=bos_id, eos_id=eos_id)
    spec.optimize(quantization="float32")
    directory.mkdir(parents=True, exist_ok=True)
    spec.save(str(directory))
    save_config(config, directory)
    return directory


def supported_compute_types() -> frozenset[str]:
    """The compute types CTranslate2 runs on this CPU (its bfloat16 ones need the CPU's)."""
    return frozenset(ctranslate2.get_supported_compute_types("cpu"))


class CTranslate2Model:
    """A saved export, loaded by ``ctranslate2.Translator`` on the CPU; decodes (B, S) id tensors
    into the layout of seq2seq.search.greedy and seq2seq.search.beam."""

    def __init__(self, directory: str | Path, *, compute_type: str = "float32", threads: int = 1) -> None:
        if compute_type not in COMPUTE_TYPES:
            raise ValueError(f"compute_type must be one of {COMPUTE_TYPES}, got {compute_type!r}")
        if compute_type not in supported_compute_types():
            raise ValueError(f"compute_type {compute_type!r}: this CTranslate2 build runs "
                             f"{', '.join(sorted(supported_compute_types()))} on this CPU")
        check_int("threads", threads, low=1)
        self.config = load_config(directory)
        try:
            saved = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
            self.bos_id = int(saved["bos_token"][1:-1])  # "<id>": the start token the export was given
            self.translator = ctranslate2.Translator(
                str(directory), device="cpu", compute_type=compute_type, intra_threads=threads,
                inter_threads=1,
            )
        except (OSError, KeyError, ValueError, RuntimeError) as error:  # a damaged or partial export
            raise ValueError(f"{Path(directory) / 'model.bin'} (with its config.json): not a loadable "
                             f"CTranslate2 model ({type(error).__name__}: {error})") from None
        self.compute_type = compute_type
        self.directory = Path(directory)

    def _source(self, src: Tensor) -> list[list[str]]:
        rows = src.tolist()
        return [
            [token(i) for i in row[:n]] for row, n in zip(rows, real_lengths(self.config, src), strict=True)
        ]

    def _run_checks(self, src: Tensor, max_len: int) -> None:
        check_source_ids(self.config, src)
        if (
            isinstance(max_len, bool)
            or not isinstance(max_len, int)
            or not 1 <= max_len <= self.config.max_seq_len
        ):
            raise ValueError(
                f"max_len must be an int in [1, max_seq_len={self.config.max_seq_len}] "
                f"(it counts BOS), got {max_len!r}"
            )

    def _run(self, src: Tensor, max_len: int, **options) -> list:
        self._run_checks(src, max_len)
        return self.translator.translate_batch(
            self._source(src),
            max_decoding_length=max_len - 1,
            min_decoding_length=0,
            max_input_length=0,
            return_end_token=True,
            **options,
        )

    def _rows(self, hypotheses: list[list[str]]) -> Tensor:
        """BOS, the generated ids (EOS included where it ended), then padding: (B, L)."""
        length = 1 + max(len(h) for h in hypotheses)
        rows = torch.full((len(hypotheses), length), self.config.pad_id, dtype=torch.long)  # (B, L)
        rows[:, 0] = self.bos_id
        for row, hypothesis in zip(rows, hypotheses, strict=True):  # strings to ids: no tensor op does it
            row[1 : 1 + len(hypothesis)] = torch.tensor([int(t[1:-1]) for t in hypothesis], dtype=torch.long)
        return rows

    def _bos_only(self, src: Tensor, max_len: int) -> Tensor | None:
        """``max_len=1``, checked with the source: the BOS column, as ``greedy_decode`` gives it
        (CTranslate2 itself cannot decode zero ids); else None."""
        if max_len != 1:
            return None
        self._source(src)
        return torch.full((src.shape[0], 1), self.bos_id, dtype=torch.long)  # (B, 1)

    def greedy(self, src: Tensor, *, max_len: int) -> Tensor:
        """Greedy decoding (beam 1): the (B, L) ids of ``greedy_decode``, L <= max_len."""
        self._run_checks(src, max_len)
        if (bos := self._bos_only(src, max_len)) is not None:
            return bos
        results = self._run(src, max_len, beam_size=1)
        return self._rows([r.hypotheses[0] for r in results])

    def beam(self, src: Tensor, *, max_len: int, beam_size: int = 4, alpha: float = 0.6) -> Hypotheses:
        """CTranslate2's beam search: its best hypothesis of each source and its score,
        log P / |Y|^alpha (see the module docstring for how this differs from seq2seq.search.beam)."""
        check_int("beam_size", beam_size, low=1)
        check_number("alpha", alpha, low_closed=True)  # as seq2seq.search.beam refuses it
        self._run_checks(src, max_len)
        if (bos := self._bos_only(src, max_len)) is not None:
            return Hypotheses(bos, torch.zeros(src.shape[0]))
        results = self._run(src, max_len, beam_size=beam_size, length_penalty=alpha, return_scores=True)
        scores = torch.tensor([r.scores[0] for r in results])  # (B,)
        return Hypotheses(self._rows([r.hypotheses[0] for r in results]), scores)

    def first_log_probs(self, src: Tensor) -> Tensor:
        """(B, V) log-probabilities of the first id after BOS, as the runtime computes them."""
        results = self._run(src, 2, beam_size=1, return_logits_vocab=True)
        return torch.stack([torch.from_numpy(np.asarray(r.logits[0][0])) for r in results])  # (B, V)
