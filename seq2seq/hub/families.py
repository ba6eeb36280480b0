"""The two families of checkpoints trained elsewhere, as Hugging Face runs them: how each one's
config reads as a ``TransformerConfig``, and where each canonical weight comes from.

    family = FAMILIES["MarianMTModel"]               # or "FSMTForConditionalGeneration"
    config = family.read_config(hf_model.config)     # a ValueError naming what cannot be expressed
    family.weight_map                                # canonical name -> Hugging Face tensor

Both families are fairseq's post-norm Transformer as BART's code names it: the same layers,
``fc1``/``fc2`` feed-forward, ``self_attn_layer_norm``, ``encoder_attn_layer_norm``,
``final_layer_norm`` after each sublayer, LayerNorm eps 1e-5, embeddings scaled by √d_model,
no LayerNorm after either stack. They differ where ``TransformerConfig`` has a field for it:

| | Marian (opus-mt) | fairseq (FSMT, WMT19) |
|---|---|---|
| ``positions`` | "marian": [sin \\| cos] from 0 | "fairseq": [sin \\| cos] from pad_id + 1 |
| ``decoder_start`` | by value: "pad" (opus-mt), "eos", "bos" (this project's BOS id) | "eos" |
| ``activation`` | "silu" (swish: the base models) or "relu" (tc-big) | "relu" |
| generator bias | ``final_logits_bias`` | none (zeros here) |
| vocabularies | one shared (most), or two | two (source, target) |

Whether the embeddings and the generator are one matrix (``share_embeddings``) is read off the
loaded model (its tied parameters are one tensor), not off config flags.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from common.config import TransformerConfig
from common.weights import Param
from seq2seq.data.ids import BOS_ID

NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which both families' layers use
# Hugging Face's activation names -> TransformerConfig.activation
ACTIVATIONS = {"relu": "relu", "swish": "silu", "silu": "silu", "gelu": "gelu"}

# canonical name -> the Hugging Face tensor it is read from ({stack}, {i}, {kind} carry over).
# The layers are one table for both families: both name them as fairseq's BART does.
LAYERS: dict[str, str | Param] = {
    "{stack}.layers.{i}.self_attn.wq.{kind}": "model.{stack}.layers.{i}.self_attn.q_proj.{kind}",
    "{stack}.layers.{i}.self_attn.wk.{kind}": "model.{stack}.layers.{i}.self_attn.k_proj.{kind}",
    "{stack}.layers.{i}.self_attn.wv.{kind}": "model.{stack}.layers.{i}.self_attn.v_proj.{kind}",
    "{stack}.layers.{i}.self_attn.wo.{kind}": "model.{stack}.layers.{i}.self_attn.out_proj.{kind}",
    "decoder.layers.{i}.cross_attn.wq.{kind}": "model.decoder.layers.{i}.encoder_attn.q_proj.{kind}",
    "decoder.layers.{i}.cross_attn.wk.{kind}": "model.decoder.layers.{i}.encoder_attn.k_proj.{kind}",
    "decoder.layers.{i}.cross_attn.wv.{kind}": "model.decoder.layers.{i}.encoder_attn.v_proj.{kind}",
    "decoder.layers.{i}.cross_attn.wo.{kind}": "model.decoder.layers.{i}.encoder_attn.out_proj.{kind}",
    "{stack}.layers.{i}.ff.w1.{kind}": "model.{stack}.layers.{i}.fc1.{kind}",
    "{stack}.layers.{i}.ff.w2.{kind}": "model.{stack}.layers.{i}.fc2.{kind}",
    "encoder.layers.{i}.norm1.{kind}": "model.encoder.layers.{i}.self_attn_layer_norm.{kind}",
    "encoder.layers.{i}.norm2.{kind}": "model.encoder.layers.{i}.final_layer_norm.{kind}",
    "decoder.layers.{i}.norm1.{kind}": "model.decoder.layers.{i}.self_attn_layer_norm.{kind}",
    "decoder.layers.{i}.norm2.{kind}": "model.decoder.layers.{i}.encoder_attn_layer_norm.{kind}",
    "decoder.layers.{i}.norm3.{kind}": "model.decoder.layers.{i}.final_layer_norm.{kind}",
    "src_embed.weight": "model.encoder.embed_tokens.weight",
    "tgt_embed.weight": "model.decoder.embed_tokens.weight",
}
ZEROS = None  # in a weight map: a canonical weight the family does not have, read as zeros


@dataclass(frozen=True)
class Family:
    """One family of checkpoints: its Hugging Face class, its config reader and its weight map."""

    name: str  # "marian" or "fairseq": also its tokenizer's kind (seq2seq.hub.tokenizers)
    architecture: str  # the Hugging Face model class
    read_config: Callable[[object], TransformerConfig]  # the HF config -> ours, or a ValueError
    weight_map: Mapping[str, str | Param | None]  # canonical name -> HF tensor (ZEROS: none)
    # HF tensors that hold no canonical weight: the sinusoid tables (recomputed from
    # TransformerConfig.positions), and Marian's shared matrix under its own name
    not_carried: tuple[str, ...]


def _same(config: object, pairs: Mapping[str, tuple[str, str]]) -> list[str]:
    """Encoder and decoder settings that one TransformerConfig field holds once, where they differ."""
    return [f"{encoder} ({getattr(config, encoder)}) differs from {decoder} ({getattr(config, decoder)}): "
            f"TransformerConfig.{field} is one number for both stacks"
            for field, (encoder, decoder) in pairs.items()
            if getattr(config, encoder) != getattr(config, decoder)]


def _common(config: object, family: str) -> tuple[dict[str, object], list[str]]:
    """The fields both families read alike, and what neither can express."""
    problems = _same(config, {"n_heads": ("encoder_attention_heads", "decoder_attention_heads"),
                              "n_layers": ("encoder_layers", "decoder_layers")})
    activation = ACTIVATIONS.get(config.activation_function)
    if activation is None:
        problems.append(f"activation_function {config.activation_function!r} is none of "
                        f"{', '.join(ACTIVATIONS)}")
    if not getattr(config, "scale_embedding", True):
        problems.append("scale_embedding is False: the rows always scale embeddings by sqrt(d_model)")
    start, problem = _decoder_start(config, family)
    problems += problem
    decoder_ff = config.decoder_ffn_dim
    fields = dict(d_model=config.d_model, n_heads=config.encoder_attention_heads,
                  n_layers=config.encoder_layers, d_ff=config.encoder_ffn_dim,
                  decoder_d_ff=None if decoder_ff == config.encoder_ffn_dim else decoder_ff,
                  dropout=float(config.dropout), max_seq_len=config.max_position_embeddings,
                  norm_eps=NORM_EPS, norm_first=False, pad_id=config.pad_token_id,
                  activation=activation or "relu", final_norm=False, decoder_start=start)
    return fields, problems


def _decoder_start(config: object, family: str) -> tuple[str, list[str]]:
    """``TransformerConfig.decoder_start`` read by value off ``decoder_start_token_id``, and what
    it cannot express. fairseq's decoder starts with EOS; a Marian decoder with padding (opus-mt),
    EOS, or this project's BOS id (a model trained here and exported: seq2seq.data.ids), the
    first of these the id equals."""
    start = config.decoder_start_token_id
    starts = {"pad": ("pad_token_id", config.pad_token_id), "eos": ("eos_token_id", config.eos_token_id),
              "bos": ("this project's BOS id", BOS_ID)}
    if family == "fairseq":
        starts = {"eos": starts["eos"]}
    for name, (_, value) in starts.items():
        if start == value:
            return name, []
    said = " nor ".join(f"{field} ({value})" for field, value in starts.values())
    return "eos", [f"decoder_start_token_id ({start}) is neither {said}: TransformerConfig.decoder_start "
                   f"is {' or '.join(repr(name) for name in starts)} for a {family} checkpoint"]


def _config(fields: dict[str, object], problems: list[str], architecture: str) -> TransformerConfig:
    if problems:
        raise ValueError(f"this {architecture} cannot be expressed as a TransformerConfig:\n  "
                         + "\n  ".join(problems))
    return TransformerConfig(**fields)


def read_marian_config(config: object, share_embeddings: bool = False) -> TransformerConfig:
    """A ``MarianConfig`` as a TransformerConfig (``share_embeddings`` is the loaded model's)."""
    fields, problems = _common(config, "marian")
    target = config.vocab_size if config.share_encoder_decoder_embeddings else config.decoder_vocab_size
    fields.update(src_vocab_size=config.vocab_size, tgt_vocab_size=target, positions="marian",
                  share_embeddings=share_embeddings)
    return _config(fields, problems, "MarianMTModel")


def read_fsmt_config(config: object, share_embeddings: bool = False) -> TransformerConfig:
    """An ``FSMTConfig`` as a TransformerConfig (``share_embeddings`` is the loaded model's)."""
    fields, problems = _common(config, "fairseq")
    fields.update(src_vocab_size=config.src_vocab_size, tgt_vocab_size=config.tgt_vocab_size,
                  positions="fairseq", share_embeddings=share_embeddings)
    return _config(fields, problems, "FSMTForConditionalGeneration")


FAMILIES: dict[str, Family] = {
    "MarianMTModel": Family(
        "marian", "MarianMTModel", read_marian_config,
        {**LAYERS, "generator.weight": "lm_head.weight",
         "generator.bias": Param("final_logits_bias", layout="1 v -> v")},
        not_carried=("model.shared.weight", "model.encoder.embed_positions.weight",
                     "model.decoder.embed_positions.weight")),
    "FSMTForConditionalGeneration": Family(
        "fairseq", "FSMTForConditionalGeneration", read_fsmt_config,
        {**LAYERS, "generator.weight": "model.decoder.output_projection.weight", "generator.bias": ZEROS},
        not_carried=("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")),
}
