"""A Hugging Face translation model to this project's model file: the weights under their
canonical names, the config read as a ``TransformerConfig``, and the tokenizer carried inside.

    record = convert("Helsinki-NLP/opus-mt-en-de")     # a folder, or a hub name (needs a network)
    save(record, "opus-mt-en-de.pt")                   # seq2seq.storage.model_file
    # python -m seq2seq.translate opus-mt-en-de.pt "Hello." --variant mathfirst

Every file of the folder is read and checked first (``seq2seq.hub.hf_folder``: a damaged or
mismatched file is one ``FileError`` naming it, and the weights file holds exactly the tensors
its config implies); only then does transformers (the optional ``hf`` extra) build its model,
which must hold the file's tensors unchanged; nothing here runs it. ``convert`` checks the whole
map before it returns: every canonical
weight comes from one Hugging Face tensor of the expected shape (``canonical_shapes``), and every
Hugging Face tensor goes somewhere or is one the family does not carry (the sinusoid tables,
which ``TransformerConfig.positions`` recomputes, and which are checked against it). Problems
are one ``ValueError`` naming each.

Where the checkpoint's generation settings forbid single ids (``bad_words_ids``: opus-mt
forbids its padding id, which is also the decoder's start), the model file carries them as a
decoding setting (``ModelFile.banned_ids``) that every search here applies, as ``generate``
does; the weights stay the checkpoint's, so the forward is Hugging Face's in every column
(docs/real-checkpoints.md).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch
from einops import rearrange
from torch import Tensor

from common.cli import first_line
from common.config import TransformerConfig
from common.files import FileError
from common.positions import position_table
from common.weights import TIED, Param, canonical_shapes, match_patterns
from seq2seq.data.ids import BOS_ID
from seq2seq.data.subwords import Vocabulary
from seq2seq.hub.families import FAMILIES, NORM_EPS, ZEROS, Family
from seq2seq.hub.hf_folder import WEIGHTS, CheckedFolder, hf_library, read_folder
from seq2seq.hub.tokenizers import MARIAN_STARTS, FairseqTokenizer, MarianTokenizer, joint_vocabulary
from seq2seq.storage.model_file import ModelFile

# Hugging Face builds its sinusoid tables in float32 (even in a float64 model): fairseq's angles
# position x frequency, rounded in float32, are off by up to about 1e-4 at position 1000; a
# wrong layout or a position off by one is off by O(0.1) somewhere
POSITIONS_TOLERANCE = 1e-3
# what a hub name downloads: every file a checkpoint folder needs but the weights of other libraries
HUB_FILES = ["*.json", "*.spm", "merges.txt", "model.safetensors*"]


def local_folder(name: str | os.PathLike) -> Path:
    """``name`` as a folder on this machine: itself, or a hub name's files as huggingface_hub
    downloads them (that needs a network); anything else is a ``ValueError`` naming it."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"{name}: a file, not a folder saved by save_pretrained")
    if path.is_absolute() or str(name).startswith((".", "~")):
        raise ValueError(f"{name}: no such folder (a hub name looks like Helsinki-NLP/opus-mt-en-de)")
    hf_library()
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(str(name), allow_patterns=HUB_FILES))
        if not any((folder / weights).exists() for weights in WEIGHTS):  # a checkpoint without safetensors
            folder = Path(snapshot_download(str(name), allow_patterns=[*HUB_FILES, "pytorch_model*"]))
    except Exception as error:  # huggingface_hub's kinds for offline, unknown, gated, ...
        raise ValueError(f"{name}: cannot fetch it from the Hugging Face hub "
                         f"({type(error).__name__}: {first_line(error)})") from None
    return folder


def load_hf_model(name: str | os.PathLike) -> tuple[torch.nn.Module, object, Family]:
    """The Hugging Face model and tokenizer at ``name`` (a folder, or a hub name), and its
    family, once every file of the folder is checked (``seq2seq.hub.hf_folder``: a damaged or
    mismatched file is a ``FileError`` naming it)."""
    return load_checked(read_folder(local_folder(name)))


def load_checked(checked: CheckedFolder) -> tuple[torch.nn.Module, object, Family]:
    """``load_hf_model`` of a folder already checked: transformers' model holds exactly the
    weights file's tensors (refused otherwise), and runs the checked generation settings."""
    transformers, family = hf_library(), checked.family
    model = getattr(transformers, family.architecture).from_pretrained(checked.folder).eval()
    loaded = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers())}
    recomputed = {name for name in family.not_carried if "embed_positions" in name}
    changed = [name for name, tensor in checked.tensors.items() if name not in recomputed
               and not torch.equal(loaded[name].detach(), tensor.to(loaded[name].dtype))]
    if changed:
        raise ValueError(f"{checked.weights_file}: transformers loaded {changed[0]} other than the file "
                         "holds it")
    model.generation_config = checked.generation
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(checked.folder)
    except Exception as error:  # whatever the tokenizer's own reading raises, past the files' checks
        raise FileError(checked.folder / "tokenizer_config.json", "transformers cannot load the tokenizer it "
                        f"describes ({type(error).__name__}: {first_line(error)})") from None
    return model, tokenizer, family


def convert(name: str | os.PathLike, variant: str = "explicit") -> ModelFile:
    """The model file of the Hugging Face model at ``name`` (see the module docstring); it
    records ``variant`` as the one to build by default, and where the generation settings came
    from (``settings["hub"]["generation_source"]``)."""
    checked = read_folder(local_folder(name))
    model, tokenizer, family = load_checked(checked)
    record = convert_loaded(model, tokenizer, family, source=str(name), variant=variant)
    source = checked.generation_source or "generation_config.json"
    hub = {**record.settings["hub"], "generation_source": source}
    return dataclasses.replace(record, settings={**record.settings, "hub": hub})


def convert_loaded(model: torch.nn.Module, tokenizer: object, family: Family, *, source: str,
                   variant: str = "explicit") -> ModelFile:
    """``convert`` of a model and tokenizer already loaded by transformers."""
    tensors = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers())}
    tied = len({tensors[name].data_ptr() for name in _embedding_names(family)}) == 1
    config = family.read_config(model.config, share_embeddings=tied)
    weights = canonical_weights(tensors, family, config)
    banned = _banned_ids(model, config)  # a decoding setting: the weights stay the checkpoint's
    generation = model.generation_config
    settings = {"hub": {
        "source": source, "architecture": family.architecture,
        "transformers": hf_library().__version__, "banned_ids": banned,
        # what Hugging Face's generate would do by default; the searches here run their own
        # settings (docs/real-checkpoints.md)
        "generation": {key: getattr(generation, key, None) for key in
                       ("num_beams", "length_penalty", "max_length", "forced_eos_token_id")}}}
    ours = carried_tokenizer(tokenizer, family, config.decoder_start)
    _check_tokenizer(ours, model.config, config)
    if isinstance(ours, Vocabulary):  # a model of this project's, going home
        return ModelFile(variant, config, settings, weights, vocabulary=ours.to_tensor(),
                         banned_ids=tuple(banned))
    return ModelFile(variant, config, settings, weights, tokenizer=ours.to_record(), banned_ids=tuple(banned))


def _check_tokenizer(tokenizer: MarianTokenizer | FairseqTokenizer | Vocabulary, hf_config: object,
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


def carried_tokenizer(tokenizer: object, family: Family,
                      decoder_start: str) -> MarianTokenizer | FairseqTokenizer | Vocabulary:
    """The tokenizer as the model file carries it (``seq2seq.hub.tokenizers``): its files, as
    Hugging Face's tokenizer saves them, and its settings; its decoder starting as
    ``decoder_start`` (``TransformerConfig.decoder_start``) says. A Marian decoder that starts
    with this project's BOS is a model of this project's, whose tokenizer is its joint
    sentencepiece vocabulary (``joint_vocabulary``): that vocabulary is returned, and any other
    tokenizer is a ``ValueError``."""
    clean_up = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        if family.name == "fairseq":
            return FairseqTokenizer.from_folder(folder, [tokenizer.src_lang, tokenizer.tgt_lang],
                                                lower_case=bool(tokenizer.do_lower_case), clean_up=clean_up)
        start = decoder_start if decoder_start in MARIAN_STARTS else "pad"
        ours = MarianTokenizer.from_folder(folder, clean_up=clean_up, start=start)
    if decoder_start != "bos":
        return ours
    if (vocabulary := joint_vocabulary(ours)) is None:
        raise ValueError(f"the decoder starts with this project's BOS id ({BOS_ID}), but the tokenizer is "
                         "not this project's joint sentencepiece vocabulary (one sentencepiece model for "
                         "both sides, each piece its own id), the only one here whose decoder starts so")
    return vocabulary


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
