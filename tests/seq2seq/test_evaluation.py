"""Held-out evaluation: the held-out set is no training batch, and the accuracy the command
lines report, on a model whose answers are scripted.

``ScriptedModel`` decodes, for each source row, exactly the tokens that row lists (it reads
them from the source), so every row's greedy output, and so the right accuracy, is known here.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from common.config import TransformerConfig
from seq2seq.data.ids import BOS_ID, EOS_ID, PAD_ID
from seq2seq.data.tasks import task_batches
from seq2seq.evaluation import exact_match_accuracy, held_out_batch

VOCAB = 8
A, B, C, D = 3, 4, 5, 6  # content tokens; 0, 1, 2 are PAD, BOS, EOS


class ScriptedModel(nn.Module):
    """encode/decode/project whose greedy decoding of source row ``[t1, t2, ...]`` is
    ``BOS t1 t2 ...``: the most likely token after position i is the source's token i.

    The source holds the answer, not a question; ``decoded_in_training`` records the mode of
    every decode call.
    """

    def __init__(self) -> None:
        super().__init__()
        self.config = TransformerConfig(d_model=VOCAB, n_heads=1, n_layers=1, d_ff=4, dropout=0.0,
                                        src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, max_seq_len=16,
                                        pad_id=PAD_ID)
        self.unused = nn.Parameter(torch.zeros(1))  # a device for exact_match_accuracy to read
        self.decoded_in_training: list[bool] = []

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return nn.functional.one_hot(src, VOCAB).float()  # (B, S, V): token i of the answer

    def decode(self, tgt: Tensor, memory: Tensor, src_mask=None, tgt_mask=None) -> Tensor:
        self.decoded_in_training.append(self.training)
        return memory[:, : tgt.shape[1]]  # (B, T, V): after position i, the answer's token i

    def project(self, hidden: Tensor) -> Tensor:
        return (10.0 * hidden).log_softmax(dim=-1)


def row(*tokens: int, width: int) -> list[int]:
    return [*tokens] + [PAD_ID] * (width - len(tokens))


# (what the model answers after BOS, the target): max_len = 6, so an answer is at most 5 tokens
ROWS = {
    "right": ([A, B, C, EOS_ID], [BOS_ID, A, B, C, EOS_ID]),
    "one token wrong": ([A, D, C, EOS_ID], [BOS_ID, A, B, C, EOS_ID]),
    "only BOS matches": ([C, C, A, A, C], [BOS_ID, A, B, C, D, EOS_ID]),
    "right, short, padded": ([A, EOS_ID], [BOS_ID, A, EOS_ID]),
    "one token too many": ([A, A, EOS_ID], [BOS_ID, A, EOS_ID]),
    "ends too early": ([A, B, EOS_ID], [BOS_ID, A, B, C, EOS_ID]),
    "right, full length": ([D, C, B, A, EOS_ID], [BOS_ID, D, C, B, A, EOS_ID]),
}
RIGHT = {"right", "right, short, padded", "right, full length"}


def scripted_batch(names) -> tuple[Tensor, Tensor]:
    src = torch.tensor([row(*ROWS[name][0], width=5) for name in names])
    tgt = torch.tensor([row(*ROWS[name][1], width=6) for name in names])
    return src, tgt


@pytest.mark.parametrize("name", list(ROWS))
def test_each_scripted_row_alone(name):
    """Each row is right or wrong by itself, whatever the others decode; 'only BOS matches'
    decodes to max_len without an EOS and differs from its target at every position but BOS."""
    src, tgt = scripted_batch([name])
    if name == "only BOS matches":
        assert (tgt[0, 1:] != src[0]).all() and EOS_ID not in src[0]
    assert exact_match_accuracy(ScriptedModel(), src, tgt) == (1.0 if name in RIGHT else 0.0)


@pytest.mark.parametrize("batch_size", [256, 3, 1])
def test_accuracy_is_the_share_of_rows_exactly_right(batch_size):
    """3 of 7 rows right, in one batch or in several (the last one short)."""
    src, tgt = scripted_batch(list(ROWS))
    assert exact_match_accuracy(ScriptedModel(), src, tgt, batch_size=batch_size) == pytest.approx(3 / 7)


@pytest.mark.parametrize("training", [True, False], ids=["from-train", "from-eval"])
def test_decodes_in_eval_mode_and_restores_the_mode(training):
    model = ScriptedModel().train(training)
    exact_match_accuracy(model, *scripted_batch(list(ROWS)), batch_size=3)
    assert model.decoded_in_training and not any(model.decoded_in_training)
    assert model.training is training


def test_held_out_batch_is_no_training_batch():
    shape = dict(vocab_size=13, min_len=1, max_len=10)
    src, tgt = held_out_batch("reverse", 64, seed=0, **shape)
    assert torch.equal(src, held_out_batch("reverse", 64, seed=0, **shape)[0])
    first_training = next(task_batches("reverse", 64, seed=0, **shape))
    assert not torch.equal(src, first_training[0])
    assert tgt.shape == first_training[1].shape
