"""The special token ids every stream and vocabulary here shares: the synthetic tasks
(``seq2seq.data.tasks``) and the subword vocabulary (``seq2seq.data.subwords``) both reserve them.

PAD is ``TransformerConfig.pad_id``'s default; decoding starts from BOS and stops at EOS.
A timing run on random weights (``benchmarks``) starts from the same BOS but ends at
``timing_eos_id``, the last target id, which such a model seldom chooses, so that its decoding
runs its full length.
"""

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2


def timing_eos_id(config) -> int:
    """The EOS of a timing run on random weights: the last target id of ``config`` (a
    ``TransformerConfig``), not EOS_ID, so that decoding runs to its length."""
    return config.tgt_vocab_size - 1
