"""A model file as a Hugging Face ``MarianMTModel`` folder: the road back from ``from_hf``, for
a model trained here or converted.

    folder = export(load("runs/fr/average.pt"), "fr-hf")   # python -m seq2seq.export_hf
    model = MarianMTModel.from_pretrained("fr-hf")          # transformers, CTranslate2, ...

The folder holds ``config.json``, ``model.safetensors`` and ``generation_config.json`` (the
decoder's start, EOS, padding, and the model file's ``banned_ids`` as ``bad_words_ids``), and
the tokenizer where the model file carries Marian's (a converted opus-mt model): its two
sentencepiece models and vocabulary, which ``MarianTokenizer`` loads. A model trained here
carries this project's joint sentencepiece vocabulary, whose ids are the model's ids: it goes
as both of Marian's sentencepiece models, with a vocabulary mapping each piece to its own id, so
``MarianTokenizer`` gives the project's ids (on text already in the corpus's NFKC form; the
project normalises first, the tokenizer does not), and the decoder starts with BOS, not with
padding as opus-mt's do; ``seq2seq.convert`` reads such a folder back to the model file's own
config (but Marian's positions), weights (permuted) and vocabulary (docs/real-checkpoints.md).

MarianMTModel computes this project's function where the config says: post-norm layers,
LayerNorm eps 1e-5, no LayerNorm after either stack, embeddings scaled by sqrt(d_model),
sinusoids in halves. Anything else is refused, one line per field (``export_problems``). The
paper's positions (``positions="paper"``) interleave sines and cosines where Marian's put them
in halves: Marian's table is the paper's with its columns permuted (``residual_order``). Applied
to every weight that reads or writes the residual stream (the embeddings' and the generator's
columns, the attention and feed-forward input columns, the output projections' and second
feed-forward layer's rows and biases, every LayerNorm's gain and shift), that one permutation
of the d_model coordinates gives the same function exactly: attention, the feed-forward network
and LayerNorm's mean and variance do not depend on the order of the coordinates
(``permute_residual``; ``restore_residual`` undoes it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from common.config import TransformerConfig
from common.weights import TIED
from seq2seq.data.ids import BOS_ID, EOS_ID
from seq2seq.data.subwords import Vocabulary
from seq2seq.hub.families import NORM_EPS
from seq2seq.hub.from_hf import hf_library, marian_model
from seq2seq.hub.tokenizers import MarianTokenizer, piece_ids, tokenizer_from_record
from seq2seq.storage.model_file import ModelFile

# canonical weights whose columns read the residual stream, and those whose rows (and biases,
# LayerNorm gains and shifts) write it
READS = re.compile(r"(embed|generator)\.weight$|\.(wq|wk|wv|w1)\.weight$")
WRITES = re.compile(r"\.(wo|w2)\.(weight|bias)$|norm\d?\.(weight|bias)$")


def export_problems(config: TransformerConfig) -> list[str]:
    """Each field of ``config`` that MarianMTModel cannot compute, named with what it needs."""
    problems = []
    if config.final_norm:
        problems.append("final_norm=True: MarianMTModel has no LayerNorm after either stack "
                        "(python -m seq2seq.train --no-final-norm trains without)")
    if config.norm_first:
        problems.append("norm_first=True: MarianMTModel's layers are post-norm")
    if config.norm_eps != NORM_EPS:
        problems.append(f"norm_eps={config.norm_eps!r}: MarianMTModel's LayerNorm eps is {NORM_EPS} "
                        f"(python -m seq2seq.train --norm-eps {NORM_EPS})")
    if config.positions == "fairseq":
        problems.append("positions='fairseq': MarianMTModel's sinusoids start at position 0 with the "
                        "paper's frequencies (a fairseq model goes back as FSMT, which this does not write)")
    return problems


def residual_order(config: TransformerConfig) -> Tensor:
    """(D,) long: Marian's coordinate j is this model's coordinate ``order[j]`` — the paper's
    even (sine) columns, then its odd (cosine) ones; the identity for Marian's own positions."""
    if config.positions == "marian":
        return torch.arange(config.d_model)
    return torch.cat([torch.arange(0, config.d_model, 2), torch.arange(1, config.d_model, 2)])


def permute_residual(weights: Mapping[str, Tensor], order: Tensor) -> dict[str, Tensor]:
    """The canonical ``weights`` with the residual stream's coordinates taken in ``order``:
    readers' columns and writers' rows (see the module docstring); the others as they are."""
    permuted = {}
    for name, tensor in weights.items():
        if READS.search(name):
            permuted[name] = tensor[:, order]
        elif WRITES.search(name):
            permuted[name] = tensor[order]
        else:
            permuted[name] = tensor
    return permuted


def restore_residual(weights: Mapping[str, Tensor], config: TransformerConfig) -> dict[str, Tensor]:
    """``permute_residual`` undone: the weights of ``config``'s own coordinates, tied names one
    tensor again where ``config.share_embeddings``."""
    restored = permute_residual(weights, torch.argsort(residual_order(config)))
    if config.share_embeddings:
        restored.update(dict.fromkeys(TIED[1:], restored[TIED[0]]))
    return restored


def special_ids(record: ModelFile) -> tuple[int, int]:
    """(decoder start, EOS): the carried tokenizer's, or this project's BOS and EOS."""
    if record.tokenizer is not None:
        tokenizer = tokenizer_from_record(record.tokenizer)
        return tokenizer.start_id, tokenizer.eos_id
    return BOS_ID, EOS_ID


def ctranslate2_problems(record: ModelFile) -> list[str]:
    """Why CTranslate2's Marian converter (``ctranslate2.converters.TransformersConverter``, 4.x)
    would not decode the exported folder as transformers does, each in words; none for a
    converted opus-mt model. Its Marian loader sets ``start_from_zero_embedding`` (the decoder's
    first input a zero vector, not the start id's embedding row: harmless only where that row is
    zero, as opus-mt's padding row is), no option or config.json field turns it off, and it drops
    the embeddings' last row as Marian's trailing ``<pad>`` whatever the last piece is."""
    problems = []
    start_id, _ = special_ids(record)
    if record.weights["tgt_embed.weight"][start_id].any():
        problems.append(f"it starts the decoder from a zero vector, not from the start id's ({start_id}) "
                        "embedding row, which is not zero here")
    last = _last_target_piece(record)
    if last is not None and last != "<pad>":
        problems.append(f"it drops the embeddings' last row as Marian's trailing <pad>, and the last piece "
                        f"here is {last!r} (it refuses the folder)")
    return problems


def _last_target_piece(record: ModelFile) -> str | None:
    """The piece of the target vocabulary's last id, or None where the file carries no tokenizer."""
    last = record.config.tgt_vocab_size - 1
    if record.tokenizer is not None:
        tokenizer = tokenizer_from_record(record.tokenizer)
        return {i: piece for piece, i in tokenizer.target_vocab.items()}.get(last)
    if record.vocabulary is not None:
        return Vocabulary.from_tensor(record.vocabulary).pieces([last])[0]
    return None


def hf_marian(record: ModelFile) -> torch.nn.Module:
    """Hugging Face's ``MarianMTModel`` computing the model file's function, in eval mode and the
    weights' dtype, its generation settings the file's (start, EOS, padding, banned ids); a
    config it cannot compute is a ``ValueError`` naming each field."""
    config = record.config
    if problems := export_problems(config):
        raise ValueError("MarianMTModel cannot compute this model:\n  " + "\n  ".join(problems))
    start_id, eos_id = special_ids(record)
    weights = permute_residual(record.weights, residual_order(config))
    dtype = record.weights["generator.weight"].dtype
    model = marian_model(config.replace(positions="marian"), weights, start_id=start_id, eos_id=eos_id)
    model = model.to(dtype).eval()
    generation = model.generation_config
    hub = record.settings.get("hub", {}).get("generation", {}) if isinstance(record.settings, Mapping) else {}
    generation.update(decoder_start_token_id=start_id, eos_token_id=eos_id, pad_token_id=config.pad_id,
                      bad_words_ids=[[i] for i in record.banned_ids] or None,
                      num_beams=hub.get("num_beams") or 4,
                      max_length=hub.get("max_length") or config.max_seq_len,
                      forced_eos_token_id=hub.get("forced_eos_token_id"))
    return model


def write_tokenizer(record: ModelFile, folder: Path) -> str:
    """The tokenizer's files in ``folder`` as ``MarianTokenizer`` saves them, and what was written,
    in words: Marian's own, carried; or this project's joint sentencepiece vocabulary as both of
    Marian's sentencepiece models, with a vocabulary mapping each piece to its own id."""
    if record.tokenizer is not None:
        tokenizer = tokenizer_from_record(record.tokenizer)
        if not isinstance(tokenizer, MarianTokenizer):
            raise ValueError(f"the model file carries a {record.tokenizer['kind']} tokenizer; "
                             "a MarianMTModel folder takes Marian's")
        source_spm, target_spm = tokenizer.source_spm, tokenizer.target_spm
        source_vocab = tokenizer.source_vocab
        target_vocab = tokenizer.target_vocab if tokenizer.separate else None
        written = "Marian's tokenizer"
    elif record.vocabulary is not None:
        vocabulary = Vocabulary.from_tensor(record.vocabulary)
        source_spm = target_spm = vocabulary.model_proto
        source_vocab = piece_ids(vocabulary)  # what joint_vocabulary recognises on the way back
        target_vocab = None
        written = "the joint sentencepiece vocabulary as a MarianTokenizer"
    else:
        return "no tokenizer (the model file carries none)"
    files = {"source_spm": folder / "source.spm", "target_spm": folder / "target.spm",
             "vocab": folder / "vocab.json"}
    files["source_spm"].write_bytes(source_spm)
    files["target_spm"].write_bytes(target_spm)
    files["vocab"].write_text(json.dumps(source_vocab, ensure_ascii=False), encoding="utf-8")
    if target_vocab is not None:
        files["target_vocab_file"] = folder / "target_vocab.json"
        files["target_vocab_file"].write_text(json.dumps(target_vocab, ensure_ascii=False), encoding="utf-8")
    hf_library().MarianTokenizer(**{key: str(path) for key, path in files.items()},
                                 separate_vocabs=target_vocab is not None).save_pretrained(folder)
    return written


def export(record: ModelFile, folder: str | os.PathLike) -> str:
    """Write ``record`` as a MarianMTModel folder at ``folder`` (a new or empty folder), all or
    nothing: written beside it, then renamed into place. Returns what the folder holds, in words."""
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"{folder}: exists and is not an empty folder; name a new one")
    model = hf_marian(record)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        model.save_pretrained(staging)
        tokenizer = write_tokenizer(record, staging)
        if folder.exists():
            folder.rmdir()  # empty, checked above
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    config = record.config
    return (f"MarianMTModel: d_model {config.d_model}, {config.n_layers}+{config.n_layers} layers, "
            f"{config.activation}, positions {config.positions!r}"
            f"{' (columns permuted to Marian halves)' if config.positions == 'paper' else ''}; {tokenizer}")
