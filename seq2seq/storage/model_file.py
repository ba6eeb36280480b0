"""Checkpoints that resume a run exactly, and model files that any variant loads.

    save(trainer.checkpoint("explicit"), "runs/a/step-00000300.pt")
    model = build_model(load("average.pt"), variant="fused")

A model file (what ``python -m seq2seq.average`` writes) holds a trained model in canonical form; a
checkpoint adds what the run's next step depends on. Files are archives of plain data read with
``torch.load(weights_only=True)`` (no pickled code runs); ``save`` refuses what ``load`` could not
read back, and writes atomically (a temporary file beside the target, fsync'd, ``os.replace``d, the
directory fsync'd; the next save removes one a killed writer left). ``load`` checks the format's
marker, version and kind and the SHA-256 digest recorded at save time (torch's reader does not
notice a flipped byte in a tensor); anything else is a ``ValueError`` naming the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from common.config import TransformerConfig
from common.weights import import_weights
from variants import build

FORMAT = "transformer-variants"  # the marker every file written here carries
VERSION = 1


@dataclass(frozen=True)
class ModelFile:
    """A trained model in canonical form, loadable into any variant."""

    variant: str  # the variant that trained it; any other can load the weights
    config: TransformerConfig
    settings: Mapping[str, object]  # the run's other settings, e.g. {"data": {...}, "recipe": {...}}
    weights: Mapping[str, Tensor]  # canonical name -> tensor (common.weights)
    # the subword vocabulary of a translation model (seq2seq.data.subwords), serialized as uint8;
    # None for the synthetic tasks, and in files written before the field existed
    vocabulary: Tensor | None = dataclasses.field(default=None, kw_only=True)
    # a converted checkpoint's own tokenizer as plain data (seq2seq.hub.tokenizers: Marian's
    # sentencepiece models, fairseq's BPE), in place of a vocabulary; None otherwise
    tokenizer: Mapping[str, object] | None = dataclasses.field(default=None, kw_only=True)
    # target ids every search here never picks, a decoding setting beside the weights (not in
    # them): a converted checkpoint's forbidden single ids, such as opus-mt's padding id
    # (seq2seq.search.strategy.apply_ban); () for a model trained here, and in older files
    banned_ids: tuple[int, ...] = dataclasses.field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        if problem := banned_ids_problem(self.banned_ids, self.config):
            raise ValueError(f"ModelFile.banned_ids {problem}")


def banned_ids_problem(banned_ids: object, config: object) -> str | None:
    """Why ``banned_ids`` cannot be a model file's (not a tuple of ints in [0, tgt_vocab_size),
    each once, in increasing order), or None."""
    if not isinstance(banned_ids, tuple) or not all(type(i) is int for i in banned_ids):
        return f"must be a tuple of ints, got {banned_ids!r}"
    if isinstance(config, TransformerConfig) and not all(0 <= i < config.tgt_vocab_size for i in banned_ids):
        return f"must lie in [0, tgt_vocab_size={config.tgt_vocab_size}), got {banned_ids!r}"
    if list(banned_ids) != sorted(set(banned_ids)):
        return f"must be increasing, each id once, got {banned_ids!r}"
    return None


@dataclass(frozen=True)
class Checkpoint(ModelFile):
    """A model file plus everything else the run's next step depends on."""

    step: int  # optimiser steps done
    optimizer: Mapping[str, object]  # torch.optim.Adam.state_dict()
    scheduler: Mapping[str, object]  # LambdaLR.state_dict(): where the schedule stands
    rng: tuple[Mapping[str, Tensor | None], ...]  # per rank: {"cpu": state, "cuda": state or None}
    data_rng: Tensor  # the batch stream's generator (every rank draws the same batches)


_KINDS = {"model": ModelFile, "checkpoint": Checkpoint}
# what torch.load(weights_only=True) reads back, besides tensors: exactly these types
_PLAIN = (dict, list, tuple, str, int, float, bool, type(None))
# the temporary file of a write: .NAME.PID.RANDOM.tmp (PID: the writing process)
_TEMPORARY_NAME = re.compile(r"\..+\.(\d+)\.[0-9a-f]{8}\.tmp")


# --- writing -------------------------------------------------------------------------------


def save(record: ModelFile, path: str | os.PathLike) -> Path:
    """Write a model file or checkpoint to ``path`` atomically (see the module docstring)."""
    if not isinstance(record, ModelFile):
        raise TypeError(f"record must be a ModelFile or Checkpoint, got {type(record).__name__}")
    if not isinstance(record.config, TransformerConfig):
        raise TypeError(f"record.config must be a TransformerConfig, got {type(record.config).__name__}")
    path = Path(path)
    kind = "checkpoint" if isinstance(record, Checkpoint) else "model"
    payload = {"format": FORMAT, "version": VERSION, "kind": kind, **{
        field.name: getattr(record, field.name) for field in dataclasses.fields(record)},
        "config": dataclasses.asdict(record.config)}
    problems: list[str] = []  # what load would refuse is refused here, before anything is written
    payload["digest"] = _digest(payload, problems)
    if problems:
        raise ValueError(f"cannot save {path}; load could not read it back:\n  " + "\n  ".join(problems))
    _write_atomically(payload, path)
    return path


def _write_atomically(payload: object, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # a temporary file whose writer (the process id in its name) no longer runs on this machine
    # will never be renamed into place: it goes (POSIX only)
    for entry in path.parent.iterdir() if os.name == "posix" else ():
        if match := _TEMPORARY_NAME.fullmatch(entry.name):
            try:
                os.kill(int(match.group(1)), 0)  # signal 0 probes; another user's process refuses it
            except ProcessLookupError:  # the writer is gone
                entry.unlink(missing_ok=True)
            except PermissionError:
                pass
    # a fresh name beside the target (so os.replace never crosses file systems), opened with
    # the usual permissions, unlike tempfile.mkstemp's 0600
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(temporary, "xb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    if os.name == "posix":  # make the rename itself durable
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def _digest(payload: Mapping[str, object], problems: list[str] | None = None) -> str:
    """SHA-256 over every field but ``digest``: tensors by dtype, shape and bytes, the rest by repr.

    ``problems`` collects, by where it sits, each value ``torch.load(weights_only=True)`` would not
    read back (anything but ``_PLAIN`` types and plain tensors); such values are not hashed.
    """
    hasher = hashlib.sha256()
    found = [] if problems is None else problems

    def feed(item: object, where: str) -> None:
        if isinstance(item, Tensor):
            if type(item) not in (Tensor, nn.Parameter):
                found.append(f"{where}: a {type(item).__name__}, a tensor subclass")
            elif item.is_meta:
                found.append(f"{where}: a meta tensor, which holds no values")
            else:
                hasher.update(f"tensor {item.dtype} {tuple(item.shape)}:".encode())
                hasher.update(item.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif type(item) not in _PLAIN:
            found.append(f"{where}: {type(item).__module__}.{type(item).__qualname__} {item!r} is not plain "
                         "data (dict, list, tuple, str, int, float, bool, None or a tensor)")
        elif isinstance(item, dict):
            found.extend(f"{where}: key {key!r} of type {type(key).__name__} (keys must be str, int, float "
                         "or bool)" for key in item if type(key) not in (str, int, float, bool))
            hasher.update(b"{")
            for key in sorted(item, key=repr):
                hasher.update(f"{type(key).__name__} {key!r};".encode())
                feed(item[key], f"{where}[{key!r}]" if where else str(key))
            hasher.update(b"}")
        elif isinstance(item, (list, tuple)):
            hasher.update(b"[" if isinstance(item, list) else b"(")
            for index, element in enumerate(item):
                feed(element, f"{where}[{index}]")
            hasher.update(b"]")
        else:
            hasher.update(f"{type(item).__name__} {item!r};".encode())

    feed({key: value for key, value in payload.items() if key != "digest"}, "")
    return hasher.hexdigest()


# --- reading -------------------------------------------------------------------------------


def load(path: str | os.PathLike) -> ModelFile:
    """The model file or checkpoint at ``path`` (a ``Checkpoint`` for a checkpoint), checked whole.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` naming the file for one
    that is truncated, corrupt, not ours, or of another version.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint or model file at {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # torch.load raises many kinds for a damaged archive; its text is not shown,
        # since it advises loading again with weights_only=False, which would run the file's code
        try:  # the names of the classes and functions the file would need to run, if it is an archive
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)  # torch >= 2.5
        except Exception:  # not an archive at all (truncated, or something else), or torch 2.4
            unsafe = []
        why = (f"(it holds a {unsafe[0]}, which is not plain data; it is not loaded, since loading it "
               "would run code from the file)" if unsafe else "(truncated or corrupt?)")
        raise ValueError(f"{path} is not a readable checkpoint {why}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        problem = f"not a {FORMAT} file (no format marker)"
    elif payload.get("version") != VERSION:
        problem = f"format version {payload.get('version')!r}; this code reads version {VERSION}"
    elif payload.get("kind") not in _KINDS:
        problem = f"unknown kind {payload.get('kind')!r}; expected one of {', '.join(_KINDS)}"
    elif payload.get("digest") != _digest(payload):  # the fields are what save checked and wrote
        problem = "contents differ from the digest recorded when it was written (corrupt)"
    else:
        problem = None
    if problem is not None:
        raise ValueError(f"{path} is not a usable checkpoint:\n  {problem}")
    kind = _KINDS[payload["kind"]]
    # a field a file lacks is None: the vocabulary and tokenizer, in files written before they
    # existed; no banned ids, in files written before those
    fields = {field.name: payload.get(field.name) for field in dataclasses.fields(kind)}
    fields["banned_ids"] = payload.get("banned_ids", ())
    try:
        fields["config"] = TransformerConfig(**fields["config"])
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path} holds an invalid config: {error}") from error
    if problem := banned_ids_problem(fields["banned_ids"], fields["config"]):
        raise ValueError(f"{path} holds invalid banned_ids: they {problem}")
    if kind is Checkpoint:
        fields["rng"] = tuple(fields["rng"])
    return kind(**fields)


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """``load``, refusing a model file: it holds no optimiser state to resume from."""
    record = load(path)
    if not isinstance(record, Checkpoint):
        raise ValueError(f"{path} is a model file (weights only), not a checkpoint to resume from")
    return record


# --- using ---------------------------------------------------------------------------------


def build_model(record: ModelFile, variant: str | None = None) -> nn.Module:
    """A fresh model of ``variant`` (default: the one that trained) holding the file's weights."""
    model = build(record.variant if variant is None else variant, record.config)
    import_weights(model, record.weights, config=record.config)
    return model
