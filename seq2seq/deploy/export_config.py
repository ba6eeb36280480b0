"""What both engines share: the check of the model an export takes, the suite's config saved
beside an export, and the checks of the source ids an engine is given (it never sees a mask:
padding is ``config.pad_id``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from torch import Tensor, nn

from common import checks
from common.config import TransformerConfig

CONFIG_FILE = "suite_config.json"  # the TransformerConfig an export computes, beside its files


def check_model(model: object) -> TransformerConfig:
    """The config of ``model``, a model of this suite (an ``nn.Module`` with a ``TransformerConfig``
    as its ``config``: any row that ``variants.build`` makes); anything else is a ``TypeError``
    naming what an export takes."""
    config = getattr(model, "config", None)
    if not isinstance(model, nn.Module) or not isinstance(config, TransformerConfig):
        raise TypeError("model must be an nn.Module of this suite, with a TransformerConfig as its config "
                        f"(see variants.build), got {type(model).__name__}")
    return config


def save_config(config: TransformerConfig, directory: Path) -> None:
    (directory / CONFIG_FILE).write_text(
        json.dumps(dataclasses.asdict(config), indent=2) + "\n", encoding="utf-8"
    )


def load_config(directory: str | Path) -> TransformerConfig:
    """The config saved with an export; ValueError naming the file if it is missing or unreadable."""
    path = Path(directory) / CONFIG_FILE
    try:
        fields = json.loads(path.read_text(encoding="utf-8"))
        return TransformerConfig(**fields)
    except FileNotFoundError:
        raise ValueError(f"{path} not found: {directory} is not an export of this suite") from None
    except (json.JSONDecodeError, TypeError, ValueError) as error:
        raise ValueError(f"{path}: not a TransformerConfig ({error})") from None


def check_source_ids(config: TransformerConfig, src: object) -> None:
    """(B, S) source ids as ``encode`` checks them, on the CPU: dtype, shape, length, id range."""
    checks.check_ids(
        "src", src, config.src_vocab_size, "src_vocab_size", config.max_seq_len, torch.device("cpu")
    )


def real_lengths(config: TransformerConfig, src: Tensor) -> list[int]:
    """Each row's count of real ids, for an engine that takes each source at its own length:
    ValueError unless the padding is trailing and every row has a real id (a padding id inside
    a row would be masked by the suite and read as a token by the engine)."""
    real = src != config.pad_id  # (B, S)
    lengths = real.sum(dim=1)  # (B,)
    trailing = real == (torch.arange(src.shape[1]) < lengths[:, None])  # (B, S)
    if not trailing.all():
        row = int((~trailing).any(dim=1).nonzero()[0])
        raise ValueError(
            f"src row {row} has padding (pad_id={config.pad_id}) before a real id; an "
            "engine takes padding only at the end of a row"
        )
    if not lengths.all():
        row = int((lengths == 0).nonzero()[0])
        raise ValueError(f"src row {row} is all padding (pad_id={config.pad_id}): nothing to translate")
    return lengths.tolist()
