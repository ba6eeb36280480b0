"""The special token ids every stream and vocabulary here shares: the synthetic tasks
(``seq2seq.data.tasks``) and the subword vocabulary (``seq2seq.data.subwords``) both reserve them.

PAD is ``TransformerConfig.pad_id``'s default; decoding starts from BOS and stops at EOS.
"""

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
