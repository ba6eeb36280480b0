"""A Hugging Face translation model to this project's model file: the weights under their
canonical names, the config read as a ``TransformerConfig``, and the tokenizer carried inside.

    record = convert("Helsinki-NLP/opus-mt-en-de")     # a folder, or a hub name (needs a network)
    save(record, "opus-mt-en-de.pt")                   # seq2seq.storage.model_file
    # python -m seq2seq.translate opus-mt-en-de.pt "Hello." --variant mathfirst

transformers (the optional ``hf`` extra) reads the checkpoint, whatever files it is stored in;
nothing here runs its model. ``convert`` checks the whole map before it returns: every canonical
weight comes from one Hugging Face tensor of the expected shape (``canonical_shapes``), and every
Hugging Face tensor goes somewhere or is one the family does not carry (the sinusoid tables,
which ``TransformerConfig.positions`` recomputes, and which are checked against it). Problems
are one ``ValueError`` naming each.

Where the checkpoint's generation settings forbid single ids (``bad_words_ids``: opus-mt
forbids its padding id, which is also the decoder's start), the generator's bias for them is
``BANNED_LOGIT``, so that no search here picks them (docs/real-checkpoints.md).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch
from einops import rearrange
from torch import Tensor

from common.config import TransformerConfig
from common.positions import position_table
from common.weights import TIED, Param, canonical_shapes, match_patterns
from seq2seq.hub.families import FAMILIES, NORM_EPS, ZEROS, Family
from seq2seq.hub.tokenizers import FairseqTokenizer, MarianTokenizer, tokenizer_from_record
from seq2seq.storage.model_file import ModelFile

# The generator bias of an id the checkpoint's generation settings forbid: the most negative
# float32, so exp(logit - max) is exactly 0 and the other ids' log-probabilities are those of a
# softmax without it (in float16 and bfloat16 it becomes -inf, with the same effect).
BANNED_LOGIT = torch.finfo(torch.float32).min
# Hugging Face builds its sinusoid tables in float32 (even in a float64 model): fairseq's angles
# position x frequency, rounded in float32, are off by up to about 1e-4 at position 1000; a
# wrong layout or a position off by one is off by O(0.1) somewhere
POSITIONS_TOLERANCE = 1e-3
MODEL_TYPES = {"marian": "MarianMTModel", "fsmt": "FSMTForConditionalGeneration"}


def hf_library():
    """The transformers module, or an ImportError naming the extra that installs it."""
    try:
        import transformers
    except ImportError as error:
        raise ImportError('converting a Hugging Face model needs transformers: '
                          'pip install -e ".[hf]"') from error
    return transformers


def load_hf_model(name: str | os.PathLike) -> tuple[torch.nn.Module, object, Family]:
    """The Hugging Face model and tokenizer at ``name`` (a folder, or a hub name transformers
    downloads), and its family; a model of another kind is a ``ValueError`` naming it."""
    transformers = hf_library()
    if not Path(name).is_dir() and (Path(name).is_absolute() or str(name).startswith((".", "~"))):
        raise ValueError(f"{name}: no such folder (a hub name looks like Helsinki-NLP/opus-mt-en-de)")
    config = transformers.AutoConfig.from_pretrained(name)
    if config.model_type not in MODEL_TYPES:
        raise ValueError(f"{name} is a {config.model_type!r} model; the converter reads "
                         + " and ".join(f"{kind} ({cls})" for kind, cls in MODEL_TYPES.items()))
    family = FAMILIES[MODEL_TYPES[config.model_type]]
    model = getattr(transformers, family.architecture).from_pretrained(name).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(name)
    return model, tokenizer, family


def convert(name: str | os.PathLike, variant: str = "explicit") -> ModelFile:
    """The model file of the Hugging Face model at ``name`` (see the module docstring); it
    records ``variant`` as the one to build by default."""
    model, tokenizer, family = load_hf_model(name)
    return convert_loaded(model, tokenizer, family, source=str(name), variant=variant)


def convert_loaded(model: torch.nn.Module, tokenizer: object, family: Family, *, source: str,
                   variant: str = "explicit") -> ModelFile:
    """``convert`` of a model and tokenizer already loaded by transformers."""
    tensors = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers())}
    tied = len({tensors[name].data_ptr() for name in _embedding_names(family)}) == 1
    config = family.read_config(model.config, share_embeddings=tied)
    weights = canonical_weights(tensors, family, config)
    banned = _banned_ids(model, config)
    if banned:
        weights["generator.bias"] = weights["generator.bias"].clone()
        weights["generator.bias"][banned] = BANNED_LOGIT
    generation = model.generation_config
    settings = {"hub": {
        "source": source, "architecture": family.architecture,
        "transformers": hf_library().__version__, "banned_ids": banned,
        # what Hugging Face's generate would do by default; the searches here run their own
        # settings (docs/real-checkpoints.md)
        "generation": {key: getattr(generation, key, None) for key in
                       ("num_beams", "length_penalty", "max_length", "forced_eos_token_id")}}}
    record = tokenizer_record(tokenizer, family)
    _check_tokenizer(tokenizer_from_record(record), model.config, config)
    return ModelFile(variant, config, settings, weights, tokenizer=record)


def _check_tokenizer(tokenizer: MarianTokenizer | FairseqTokenizer, hf_config: object,
                     config: TransformerConfig) -> None:
    """The tokenizer's sizes and special ids are the model's, or a ValueError naming each that is not."""
    pairs = {"source vocabulary": (tokenizer.source_size, config.src_vocab_size),
             "target vocabulary": (tokenizer.target_size, config.tgt_vocab_size),
             "padding id": (tokenizer.pad_id, config.pad_id),
             "EOS id": (tokenizer.eos_id, hf_config.eos_token_id),
             "decoder start id": (tokenizer.start_id, hf_config.decoder_start_token_id)}
    problems = [f"{what}: the tokenizer's {ours}, the model's {theirs}"
                for what, (ours, theirs) in pairs.items() if ours != theirs]
    if problems:
        raise ValueError("the tokenizer does not fit the model:\n  " + "\n  ".join(problems))


def _embedding_names(family: Family) -> list[str]:
    names = [family.weight_map[name] for name in TIED]
    return [name.name if isinstance(name, Param) else name for name in names]


def canonical_weights(tensors: Mapping[str, Tensor], family: Family,
                      config: TransformerConfig) -> dict[str, Tensor]:
    """canonical name -> tensor, read through ``family.weight_map`` and checked whole: a
    ``ValueError`` names every canonical weight whose tensor is missing or mis-shaped, every
    Hugging Face tensor that is neither read nor known, and a sinusoid table that is not the one
    ``config.positions`` names."""
    shapes = canonical_shapes(config)
    matched, problems = match_patterns(family.weight_map, shapes)
    weights, read = {}, set()
    for name, (source, fields) in matched.items():
        if source is ZEROS:
            weights[name] = torch.zeros(shapes[name])
            continue
        slot = source if isinstance(source, Param) else Param(source)
        hf_name = slot.name.format(**fields)
        if hf_name not in tensors:
            problems.append(f"{name}: no {hf_name} in the checkpoint")
            continue
        read.add(hf_name)
        tensor = tensors[hf_name].detach()
        if slot.layout is not None:
            tensor = rearrange(tensor, slot.layout)
        if tuple(tensor.shape) != shapes[name]:
            problems.append(f"{name}: {hf_name} has shape {tuple(tensor.shape)}, expected {shapes[name]}")
        weights[name] = tensor.clone()
    unknown = sorted(set(tensors) - read - set(family.not_carried))
    problems += [f"{name}: a tensor the map does not read (not this architecture?)" for name in unknown]
    problems += _position_problems(tensors, family, config)
    if problems:
        raise ValueError(f"cannot convert this {family.architecture}:\n  " + "\n  ".join(problems))
    if config.share_embeddings:  # one tensor under the three names, as export_weights writes it
        weights.update(dict.fromkeys(TIED[1:], weights[TIED[0]]))
    return weights


def _position_problems(tensors: Mapping[str, Tensor], family: Family, config: TransformerConfig) -> list[str]:
    """Whether Hugging Face's sinusoid tables are ``config.positions``' table (up to its float32
    rounding): row p of ours is what the token at index p gets, Marian's row p, fairseq's row
    pad_id + 1 + p."""
    offset = config.pad_id + 1 if config.positions == "fairseq" else 0
    ours = position_table(config)  # (max_seq_len, D) float64
    problems = []
    for name in (name for name in family.not_carried if "embed_positions" in name):
        table = tensors[name].detach().double()[offset:offset + config.max_seq_len]
        length = min(len(table), len(ours))
        difference = (table[:length] - ours[:length]).abs().max().item()
        if difference > POSITIONS_TOLERANCE:
            problems.append(f"{name}: differs from the {config.positions!r} table by {difference:.2g}")
    return problems


def _banned_ids(model: torch.nn.Module, config: TransformerConfig) -> list[int]:
    """The single ids the checkpoint's generation settings forbid (``bad_words_ids``)."""
    words = getattr(model.generation_config, "bad_words_ids", None) or []
    return sorted({word[0] for word in words if len(word) == 1 and 0 <= word[0] < config.tgt_vocab_size})


def tokenizer_record(tokenizer: object, family: Family) -> dict[str, object]:
    """The tokenizer as the model file carries it (``seq2seq.hub.tokenizers``): its files, as
    Hugging Face's tokenizer saves them, and its settings."""
    clean_up = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        if family.name == "marian":
            ours = MarianTokenizer.from_folder(folder, clean_up=clean_up)
        else:
            ours = FairseqTokenizer.from_folder(folder, [tokenizer.src_lang, tokenizer.tgt_lang],
                                                lower_case=bool(tokenizer.do_lower_case), clean_up=clean_up)
    return ours.to_record()


# --- the other way: canonical weights in Hugging Face's MarianMTModel ---------------------------


def marian_problem(config: TransformerConfig) -> str | None:
    """Why Hugging Face's MarianMTModel cannot compute ``config``'s function, or None: it has no
    final norms, Marian's positions, post-norm layers and LayerNorm eps 1e-5."""
    wanted = {"final_norm": False, "positions": "marian", "norm_first": False, "norm_eps": NORM_EPS}
    differ = [f"{name}={getattr(config, name)!r}" for name, value in wanted.items()
              if getattr(config, name) != value]
    if not differ:
        return None
    return (f"Hugging Face's MarianMTModel needs {', '.join(f'{k}={v!r}' for k, v in wanted.items())}; "
            f"this config has {', '.join(differ)} (e.g. --preset opus-mt-base)")


def marian_model(config: TransformerConfig, weights: Mapping[str, Tensor], *, start_id: int,
                 eos_id: int) -> torch.nn.Module:
    """Hugging Face's ``MarianMTModel`` holding canonical ``weights`` of ``config`` (a config
    ``marian_problem`` passes), in eval mode: the family's map read backwards. Its decoder
    starts with ``start_id`` and its searches end at ``eos_id``; nothing is forbidden."""
    if problem := marian_problem(config):
        raise ValueError(problem)
    transformers = hf_library()
    activation = {"silu": "swish"}.get(config.activation, config.activation)
    hf_config = transformers.MarianConfig(
        vocab_size=config.src_vocab_size, decoder_vocab_size=config.tgt_vocab_size, d_model=config.d_model,
        encoder_layers=config.n_layers, decoder_layers=config.n_layers,
        encoder_attention_heads=config.n_heads, decoder_attention_heads=config.n_heads,
        encoder_ffn_dim=config.d_ff, decoder_ffn_dim=config.decoder_ff_dim, activation_function=activation,
        max_position_embeddings=config.max_seq_len, scale_embedding=True, pad_token_id=config.pad_id,
        eos_token_id=eos_id, decoder_start_token_id=start_id, forced_eos_token_id=None,
        share_encoder_decoder_embeddings=config.share_embeddings, tie_word_embeddings=config.share_embeddings,
        dropout=config.dropout, attention_dropout=config.dropout, activation_dropout=config.dropout)
    model = transformers.MarianMTModel(hf_config).eval()
    family = FAMILIES["MarianMTModel"]
    matched, problems = match_patterns(family.weight_map, canonical_shapes(config))
    if problems:
        raise ValueError("cannot map these weights to MarianMTModel: " + "; ".join(problems))
    targets = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers())}
    with torch.no_grad():
        for name, (source, fields) in matched.items():
            slot = source if isinstance(source, Param) else Param(source)
            target = targets[slot.name.format(**fields)]
            target.copy_(weights[name].reshape(target.shape))  # final_logits_bias: (V,) -> (1, V)
    return model
