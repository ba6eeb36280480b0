"""Checkpoint averaging (paper section 6.1): one model whose weights are the mean of the last k
checkpoints' weights (``python -m seq2seq.average`` is its command line).

    save(average_files(list_checkpoints("runs/a")[-5:]), "runs/a/average.pt")

The paper's base model averages its last 5 checkpoints, written at 10-minute intervals; here
they are the 5 highest steps in the directory. The mean is taken over canonical weights
(``common.weights``), so it works for any variant, and the model file it writes loads into any
variant (``seq2seq.storage.model_file.build_model``). Each tensor's mean is computed in float64 and
stored in the tensor's own dtype; averaging one checkpoint returns its weights unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from seq2seq.storage.model_file import ModelFile, load


def average_weights(states: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """The element-wise mean of canonical weight dicts that share names, shapes and dtypes."""
    if isinstance(states, Mapping) or not isinstance(states, Sequence):
        raise TypeError(f"states must be a sequence of weight dicts, got {type(states).__name__}")
    if not states:
        raise ValueError("nothing to average: no weights given")
    first = states[0]
    for index, state in enumerate(states[1:], start=1):
        problems = [f"key {name} missing" for name in first if name not in state]
        problems += [f"unexpected key {name}" for name in state if name not in first]
        problems += [f"key {name}: {tuple(state[name].shape)} {state[name].dtype}, the first has "
                     f"{tuple(first[name].shape)} {first[name].dtype}"
                     for name in first if name in state and (state[name].shape != first[name].shape
                                                             or state[name].dtype != first[name].dtype)]
        if problems:
            raise ValueError(f"weights {index} do not match weights 0:\n  " + "\n  ".join(problems))
    return {name: torch.stack([state[name].double() for state in states]).mean(dim=0).to(tensor.dtype)
            for name, tensor in first.items()}


def average_files(paths: Sequence[str | os.PathLike]) -> ModelFile:
    """A model file holding the mean weights of these checkpoints (or model files).

    They must share one config, one vocabulary or tokenizer and one set of banned ids (the
    decoding setting a converted checkpoint carries, ``ModelFile.banned_ids``), and hold finite
    weights (one NaN would make every mean it enters NaN); the variant and settings are the last
    file's, the vocabulary, tokenizer and banned ids those they share.
    """
    if not paths:
        raise ValueError("nothing to average: no files given")
    records = [load(path) for path in paths]
    last = records[-1]
    for path, record in zip(paths, records, strict=True):
        if record.config != last.config:
            raise ValueError(f"{path} has another config than {paths[-1]}: {record.config} "
                             f"against {last.config}")
        if not _same_vocabulary(record.vocabulary, last.vocabulary):
            raise ValueError(f"{path} has another subword vocabulary than {paths[-1]}")
        if not _same_record(record.tokenizer, last.tokenizer):
            raise ValueError(f"{path} carries another tokenizer than {paths[-1]}")
        if record.banned_ids != last.banned_ids:
            raise ValueError(f"{path} bans ids {list(record.banned_ids)}, {paths[-1]} bans "
                             f"{list(last.banned_ids)}: the average carries one set of banned ids")
        not_finite = [name for name, tensor in record.weights.items() if not torch.isfinite(tensor).all()]
        if not_finite:
            raise ValueError(f"{path} holds NaN or inf in {len(not_finite)} weights, first "
                             f"{not_finite[0]}; a mean over it would be NaN or inf too")
    return ModelFile(variant=last.variant, config=last.config, settings=last.settings,
                     weights=average_weights([record.weights for record in records]),
                     vocabulary=last.vocabulary, tokenizer=last.tokenizer, banned_ids=last.banned_ids)


def _same_vocabulary(first: Tensor | None, second: Tensor | None) -> bool:
    """Whether two stored vocabularies (serialized, or None) are the same."""
    if first is None or second is None:
        return first is second
    return torch.equal(first, second)


def _same_record(first: object, second: object) -> bool:
    """Whether two stored tokenizers (plain data: mappings, lists, tensors; or None) are the same."""
    if isinstance(first, Tensor) or isinstance(second, Tensor):
        return (isinstance(first, Tensor) and isinstance(second, Tensor) and first.dtype == second.dtype
                and first.shape == second.shape and torch.equal(first, second))
    if isinstance(first, Mapping) and isinstance(second, Mapping):
        return first.keys() == second.keys() and all(_same_record(first[key], second[key]) for key in first)
    return first == second
