"""The synthetic tasks: padded answers between BOS and EOS, seeded streams, named bad settings."""

from __future__ import annotations

import pytest
import torch

from seq2seq.data import tasks
from seq2seq.data.tasks import task_batches


@pytest.mark.parametrize("task", tasks.TASKS)
def test_task_batches_are_padded_answers_between_bos_and_eos(task):
    generator = torch.Generator().manual_seed(0)
    src, tgt = tasks.sample_batch(task, 50, vocab_size=9, min_len=2, max_len=6, generator=generator)
    assert src.shape == (50, 6) and tgt.shape == (50, 8)
    assert src.dtype == tgt.dtype == torch.long
    lengths = (src != tasks.PAD_ID).sum(dim=1)
    assert lengths.min() == 2 and lengths.max() == 6  # 50 draws from 5 lengths hit both ends
    for row, n in zip(src.tolist(), lengths.tolist(), strict=True):
        assert all(token >= tasks.FIRST_TOKEN_ID for token in row[:n])
        assert all(token == tasks.PAD_ID for token in row[n:])  # padding only at the end
    for source, target, n in zip(src.tolist(), tgt.tolist(), lengths.tolist(), strict=True):
        answer = source[:n] if task == "copy" else source[:n][::-1]
        assert target == [tasks.BOS_ID, *answer, tasks.EOS_ID] + [tasks.PAD_ID] * (6 - n)


def test_same_seed_same_batches_other_seed_other_batches():
    def first_two(seed):
        stream = task_batches("copy", 8, vocab_size=12, min_len=1, max_len=7, seed=seed)
        return [t for _ in range(2) for t in next(stream)]

    for a, b in zip(first_two(0), first_two(0), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first_two(0)[0], first_two(1)[0])
    assert not torch.equal(first_two(0)[0], first_two(0)[2])  # the stream moves on


@pytest.mark.parametrize(("changes", "error", "match"), [
    (dict(task="sort"), ValueError, "unknown task"),
    (dict(vocab_size=3), ValueError, "vocab_size"),
    (dict(min_len=5, max_len=4), ValueError, "min_len"),
    (dict(batch_size=0), ValueError, "batch_size"),
    (dict(max_len=4.0), TypeError, "max_len"),
])
def test_bad_task_arguments_are_named(changes, error, match):
    arguments = {**dict(task="copy", batch_size=4, vocab_size=10, min_len=1, max_len=5), **changes}
    with pytest.raises(error, match=match):
        tasks.sample_batch(arguments.pop("task"), arguments.pop("batch_size"), **arguments)
