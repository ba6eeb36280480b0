"""Checkpoints that resume a run exactly, and model files that any variant loads.

    save(checkpoint, checkpoint_path("runs/a", checkpoint.step))   # runs/a/step-00000300.pt
    checkpoint = load_checkpoint(latest_checkpoint("runs/a"))
    model = build_model(load("average.pt"), variant="fused")

A **checkpoint** holds the weights in canonical form (``common.weights``), Adam's state, the
schedule's step, the RNG states (per process: torch's CPU generator and, on CUDA, the device's;
once: the batch stream's generator), the config, the variant's name and the run's other
settings. A **model file** (what ``python -m seq2seq.average`` writes) holds only the variant
name, config, settings and canonical weights, and a translation model's subword vocabulary
(``vocabulary``, optional: files without it load with ``None``); every checkpoint is also a model
file, and any variant can load either (``build_model``).

Files are ``torch.save`` archives of plain dicts, lists, tuples, tensors, strings, numbers and
None, read back with ``torch.load(weights_only=True)`` (no pickled code runs). ``save`` and
``load`` are symmetric: ``save`` runs the checks ``load`` runs, and refuses anything else (a
``pathlib.Path`` in the settings, say) before writing. Writing is atomic: a temporary file in
the same directory, flushed and fsync'd, then ``os.replace`` onto the final name and an fsync of
the directory, so a crash mid-write leaves every existing file as it was; the temporary file of
a process that died mid-write is removed by the next ``save`` into that directory. Reading is
strict: the archive must load, carry this format's marker, version and every field with its
type, and match the SHA-256 digest of its contents recorded at save time (torch's reader does
not notice a flipped byte inside a tensor). Anything else is a ``ValueError`` naming the file,
raised before anything is loaded into a model.

``directory_problem`` and ``file_problem`` say, before a run starts, why its files could not be
written where it was asked to write them.
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

from common.cli import first_line
from common.config import TransformerConfig
from common.weights import import_weights
from variants import build

FORMAT = "transformer-variants"  # the marker every file written here carries
VERSION = 1
_CHECKPOINT_NAME = re.compile(r"step-(\d+)\.pt")


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


@dataclass(frozen=True)
class Checkpoint(ModelFile):
    """A model file plus everything else the run's next step depends on."""

    step: int  # optimiser steps done
    optimizer: Mapping[str, object]  # torch.optim.Adam.state_dict()
    scheduler: Mapping[str, object]  # LambdaLR.state_dict(): where the schedule stands
    rng: tuple[Mapping[str, Tensor | None], ...]  # per rank: {"cpu": state, "cuda": state or None}
    data_rng: Tensor  # the batch stream's generator (every rank draws the same batches)


# field -> its type in a file; ModelFile's fields come first
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "variant": str, "config": dict, "settings": dict, "weights": dict, "vocabulary": (Tensor, type(None)),
    "step": int, "optimizer": dict, "scheduler": dict, "rng": (list, tuple), "data_rng": Tensor,
}
_KINDS = {"model": ModelFile, "checkpoint": Checkpoint}
_OPTIONAL = {"vocabulary": None}  # field -> its value in a file that lacks it (an older file)
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
    payload: dict[str, object] = {"format": FORMAT, "version": VERSION,
                                  "kind": "checkpoint" if isinstance(record, Checkpoint) else "model"}
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        payload[field.name] = dataclasses.asdict(value) if field.name == "config" else value
    # what load would refuse is refused here, before anything is written
    problems = _unreadable(payload) or _problems(payload)
    if problems:
        raise ValueError(f"cannot save {path}; load could not read it back:\n  " + "\n  ".join(problems))
    payload["digest"] = _digest(payload)
    _write_atomically(payload, path)
    return path


def _unreadable(value: object, where: str = "") -> list[str]:
    """Every value inside ``value`` that ``torch.load(weights_only=True)`` would not read back
    (anything but ``_PLAIN`` types and plain CPU-loadable tensors), each by where it sits."""
    if isinstance(value, Tensor):
        if type(value) not in (Tensor, nn.Parameter):
            return [f"{where}: a {type(value).__name__}, a tensor subclass"]
        return [f"{where}: a meta tensor, which holds no values"] if value.is_meta else []
    if type(value) not in _PLAIN:
        return [f"{where}: {type(value).__module__}.{type(value).__qualname__} {value!r} is not plain "
                "data (dict, list, tuple, str, int, float, bool, None or a tensor)"]
    if isinstance(value, dict):
        problems = [f"{where}: key {key!r} of type {type(key).__name__} (keys must be str, int, float "
                    "or bool)" for key in value if type(key) not in (str, int, float, bool)]
        for key, item in value.items():
            problems += _unreadable(item, f"{where}[{key!r}]" if where else str(key))
        return problems
    if isinstance(value, (list, tuple)):
        return [problem for index, item in enumerate(value)
                for problem in _unreadable(item, f"{where}[{index}]")]
    return []


def _write_atomically(payload: object, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(path.parent)
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


def _remove_stale_temporaries(directory: Path) -> None:
    """Delete the temporary files that processes killed mid-write left in ``directory``.

    A temporary file's name carries its writer's process id; one whose writer no longer runs
    on this machine will never be renamed into place. Those of running processes (this one
    included) are left alone: they may be writing now.
    """
    if os.name != "posix":  # os.kill(pid, 0) probes a process only on POSIX
        return
    for entry in directory.iterdir():
        match = _TEMPORARY_NAME.fullmatch(entry.name)
        if match and not _running(int(match.group(1))):
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (signal 0 probes without sending)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _digest(payload: Mapping[str, object]) -> str:
    """SHA-256 over every field but ``digest``: tensors by dtype, shape and bytes, the rest by repr."""
    hasher = hashlib.sha256()

    def feed(item: object) -> None:
        if isinstance(item, Tensor):
            hasher.update(f"tensor {item.dtype} {tuple(item.shape)}:".encode())
            data = item.detach().cpu().contiguous().reshape(-1)
            hasher.update(data.view(torch.uint8).numpy().tobytes())
        elif isinstance(item, Mapping):
            hasher.update(b"{")
            for key in sorted(item, key=repr):
                feed(key)
                feed(item[key])
            hasher.update(b"}")
        elif isinstance(item, (list, tuple)):
            hasher.update(b"[" if isinstance(item, list) else b"(")
            for element in item:
                feed(element)
            hasher.update(b"]")
        else:
            hasher.update(f"{type(item).__name__} {item!r};".encode())

    feed({key: value for key, value in payload.items() if key != "digest"})
    return hasher.hexdigest()


# --- reading -------------------------------------------------------------------------------


def load(path: str | os.PathLike) -> ModelFile:
    """The model file or checkpoint at ``path`` (a ``Checkpoint`` for a checkpoint), checked whole.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` naming the file for one
    that is truncated, corrupt, not ours, of another version, or lacking a field.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint or model file at {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch.load raises many kinds for a damaged archive
        raise ValueError(f"{path} is not a readable checkpoint {_why_unreadable(error)}") from error
    problems = _problems(payload)
    if not problems and payload.get("digest") != _digest(payload):
        problems = ["contents differ from the digest recorded when it was written (corrupt)"]
    if problems:
        raise ValueError(f"{path} is not a usable checkpoint:\n  " + "\n  ".join(problems))
    kind = _KINDS[payload["kind"]]
    fields = {field.name: payload.get(field.name, _OPTIONAL.get(field.name))
              for field in dataclasses.fields(kind)}
    try:
        fields["config"] = TransformerConfig(**fields["config"])
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path} holds an invalid config: {error}") from error
    if kind is Checkpoint:
        fields["rng"] = tuple(fields["rng"])
    return kind(**fields)


def _why_unreadable(error: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` failed, in words for an untrusted file.

    torch's own message for a file its safe reader refuses advises loading it again with
    ``weights_only=False``, which runs whatever code the file holds: that advice is never
    passed on. What is kept is the reader's reason (its "WeightsUnpickler error" line).
    """
    text = str(error)
    if "weights_only" not in text and "Weights only" not in text:
        return f"(truncated or corrupt?): {first_line(error)}"
    reason = re.search(r"WeightsUnpickler error:\s*(.+)", text)  # the reason may follow on a later line
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if found:
        return (f"(it holds a {found.group(1)}, which is not plain data; it is not loaded, "
                "since loading it would run code from the file)")
    detail = reason.group(1).strip() if reason else "the safe reader refused it"
    return f"(truncated or corrupt?): {detail}"


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """``load``, refusing a model file: it holds no optimiser state to resume from."""
    record = load(path)
    if not isinstance(record, Checkpoint):
        raise ValueError(f"{path} is a model file (weights only), not a checkpoint to resume from")
    return record


def _problems(payload: object) -> list[str]:
    """Everything wrong with a loaded archive, before any of it is used."""
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        return [f"not a {FORMAT} file (no format marker)"]
    if payload.get("version") != VERSION:
        return [f"format version {payload.get('version')!r}; this code reads version {VERSION}"]
    if payload.get("kind") not in _KINDS:
        return [f"unknown kind {payload.get('kind')!r}; expected one of {', '.join(_KINDS)}"]
    names = [field.name for field in dataclasses.fields(_KINDS[payload["kind"]])]
    problems = [f"field {name}: missing" for name in names if name not in payload and name not in _OPTIONAL]
    problems += [f"field {name}: expected {_type_name(_FIELDS[name])}, got {type(payload[name]).__name__}"
                 for name in names if name in payload and not _is(payload[name], _FIELDS[name])]
    if problems:
        return problems
    problems += [f"weights: {name!r} is not a tensor" for name, tensor in payload["weights"].items()
                 if not isinstance(name, str) or not isinstance(tensor, Tensor)]
    if "rng" in names and not all(isinstance(state, dict) and isinstance(state.get("cpu"), Tensor)
                                  for state in payload["rng"]):
        problems.append("field rng: expected one {'cpu': tensor, 'cuda': ...} per process")
    return problems


def _is(value: object, kind: type | tuple[type, ...]) -> bool:
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def _type_name(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__


# --- using ---------------------------------------------------------------------------------


def check_resumable(checkpoint: Checkpoint, *, variant: str, config: TransformerConfig,
                    settings: Mapping[str, object], processes: int) -> None:
    """Raise ``ValueError`` naming every way ``checkpoint`` is not this run's (nothing is loaded).

    Resuming needs the same variant, config and settings, and as many processes: each process
    keeps its own dropout RNG stream.
    """
    problems = []
    if checkpoint.variant != variant:
        problems.append(f"variant: checkpoint {checkpoint.variant!r}, this run {variant!r}")
    problems += _differences("config", dataclasses.asdict(checkpoint.config), dataclasses.asdict(config))
    problems += _differences("settings", checkpoint.settings, settings)
    if len(checkpoint.rng) != processes:
        problems.append(f"processes: checkpoint written by {len(checkpoint.rng)}, this run has "
                        f"{processes} (each process keeps its own dropout RNG stream)")
    if problems:
        raise ValueError("checkpoint is not from this run:\n  " + "\n  ".join(problems))


def _differences(prefix: str, stored: Mapping[str, object], current: Mapping[str, object]) -> list[str]:
    """'prefix.key: checkpoint X, this run Y' for each key whose values differ, nested dicts by key."""
    found = []
    for key in sorted({*stored, *current}, key=str):
        mine, theirs = stored.get(key), current.get(key)
        if isinstance(mine, Mapping) and isinstance(theirs, Mapping):
            found += _differences(f"{prefix}.{key}", mine, theirs)
        elif mine != theirs:
            found.append(f"{prefix}.{key}: checkpoint {mine!r}, this run {theirs!r}")
    return found


def build_model(record: ModelFile, variant: str | None = None) -> nn.Module:
    """A fresh model of ``variant`` (default: the one that trained) holding the file's weights."""
    model = build(record.variant if variant is None else variant, record.config)
    import_weights(model, record.weights, config=record.config)
    return model


def capture_rng(device: torch.device) -> dict[str, Tensor | None]:
    """This process's dropout RNG: torch's CPU generator, and on CUDA the device's generator."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return {"cpu": torch.get_rng_state(), "cuda": cuda}


def rng_problems(state: Mapping[str, Tensor | None], device: torch.device) -> list[str]:
    """Why ``restore_rng(state, device)`` would fail, tried on scratch generators: nothing of
    this process's RNG changes."""
    problems = generator_problems("rng cpu", state.get("cpu"), torch.device("cpu"))
    if device.type == "cuda" and state.get("cuda") is not None:
        problems += generator_problems("rng cuda", state["cuda"], device)
    return problems


def generator_problems(name: str, state: object, device: torch.device) -> list[str]:
    """Why a ``torch.Generator`` on ``device`` would refuse ``state`` (tried on a scratch one)."""
    if not isinstance(state, Tensor):
        return [f"{name}: expected a generator state tensor, got {type(state).__name__}"]
    try:
        torch.Generator(device=device).set_state(state)
    except (RuntimeError, TypeError, ValueError) as error:
        return [f"{name}: not a generator state of this kind ({first_line(error)})"]
    return []


def restore_rng(state: Mapping[str, Tensor | None], device: torch.device) -> None:
    """Put back what ``capture_rng`` took (the CUDA state only when training on CUDA again)."""
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)




# --- where they live -------------------------------------------------------------------------


def checkpoint_path(directory: str | os.PathLike, step: int) -> Path:
    """``directory/step-00000300.pt``: the name sorts by step."""
    return Path(directory) / f"step-{step:08d}.pt"


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """The ``step-*.pt`` files in ``directory``, oldest step first (none if it does not exist)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(match.group(1)), path) for path in directory.iterdir()
             if (match := _CHECKPOINT_NAME.fullmatch(path.name))]
    return [path for _, path in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike) -> Path:
    """The checkpoint of the highest step in ``directory``; ``ValueError`` if it holds none."""
    found = list_checkpoints(directory)
    if not found:
        raise ValueError(f"no checkpoint (step-*.pt) in {directory}")
    return found[-1]
