"""A joint subword vocabulary for both languages (sentencepiece BPE or unigram), trained in
memory and carried inside the model file.

    vocabulary = train_vocabulary(corpus_sentences, VocabularySettings(size=8000))
    ids = vocabulary.encode(["Hello."])          # [[..]]: pieces only, no BOS/EOS
    vocabulary.decode(ids)                       # ["Hello."]
    tensor = vocabulary.to_tensor()              # the serialized model, as uint8 (for checkpoints)
    Vocabulary.from_tensor(tensor).encode(...)   # the same vocabulary, anywhere

Ids 0, 1, 2 are PAD, BOS and EOS (``seq2seq.data.ids``) and 3
is the unknown piece. sentencepiece normalises nothing here (its ``identity`` rule): the corpus
loader has already normalised the text, so ``decode(encode(s)) == s`` for a normalised ``s``
whose characters the vocabulary covers (``character_coverage`` 1.0: every character of the
training sentences). Training reads the sentences from an iterator and writes the model to
memory: no file is written.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from common.checks import check_int
from seq2seq.data.ids import BOS_ID, EOS_ID, PAD_ID

UNK_ID = 3
MODEL_TYPES: tuple[str, ...] = ("bpe", "unigram")


@dataclass(frozen=True)
class VocabularySettings:
    """What sentencepiece trains."""

    size: int = 8000  # pieces in all, PAD, BOS, EOS and UNK included
    model_type: str = "bpe"  # "bpe" or "unigram"

    def __post_init__(self) -> None:
        if check_int("VocabularySettings.size", self.size) <= UNK_ID + 1:
            raise ValueError(f"VocabularySettings.size must exceed {UNK_ID + 1} (ids 0-3 are PAD, BOS, "
                             f"EOS, UNK), got {self.size}")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"VocabularySettings.model_type must be one of {', '.join(MODEL_TYPES)}, "
                             f"got {self.model_type!r}")


def _sentencepiece():
    """The sentencepiece module, or an ImportError saying which extra installs it."""
    try:
        import sentencepiece
    except ImportError as error:
        raise ImportError('translation needs sentencepiece: pip install -e ".[translate]"') from error
    return sentencepiece


class Vocabulary:
    """A trained sentencepiece model: text to ids and back, and its serialized form."""

    # the ids translation uses (a converted checkpoint's tokenizer has its own: seq2seq.hub)
    pad_id, eos_id, start_id = PAD_ID, EOS_ID, BOS_ID

    def __init__(self, model_proto: bytes) -> None:
        if not isinstance(model_proto, bytes) or not model_proto:
            raise TypeError("model_proto must be the non-empty bytes of a sentencepiece model")
        processor = _sentencepiece().SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(model_proto)
        except RuntimeError as error:
            raise ValueError(f"not a sentencepiece model ({error})") from None
        ids = (processor.pad_id(), processor.bos_id(), processor.eos_id(), processor.unk_id())
        if ids != (PAD_ID, BOS_ID, EOS_ID, UNK_ID):
            raise ValueError(f"the sentencepiece model's PAD, BOS, EOS, UNK ids are {ids}; this project "
                             f"needs {(PAD_ID, BOS_ID, EOS_ID, UNK_ID)}")
        self.model_proto = model_proto
        self._processor = processor

    @property
    def size(self) -> int:
        """Pieces in all: the model's source and target vocabulary size."""
        return self._processor.get_piece_size()

    @property
    def source_size(self) -> int:
        """The source side's pieces: the joint vocabulary's."""
        return self.size

    @property
    def target_size(self) -> int:
        """The target side's pieces: the joint vocabulary's."""
        return self.size

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's piece ids, without BOS or EOS."""
        if isinstance(texts, str):
            raise TypeError("encode takes a sequence of texts, got one str")
        return self._processor.encode(list(texts))

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """The text of each id sequence; PAD, BOS and EOS ids are left out. An id outside
        [0, size) is a ``ValueError``, one that is not an int a ``TypeError``."""
        special, size = (PAD_ID, BOS_ID, EOS_ID), self.size
        rows = []
        for number, row in enumerate(ids):
            for i in row:
                check_int(f"decode: row {number}'s id", i)
                if not 0 <= i < size:
                    raise ValueError(f"decode: row {number} holds id {i}, outside the vocabulary's "
                                     f"[0, {size})")
            rows.append([int(i) for i in row if i not in special])
        return self._processor.decode(rows)

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The piece each id stands for, as sentencepiece writes it (a word's first piece
        starts with U+2581); PAD, BOS, EOS and UNK as ``<pad>``, ``<s>``, ``</s>``, ``<unk>``.
        An id outside [0, size) is a ``ValueError``, one that is not an int a ``TypeError``."""
        ids, size = list(ids), self.size
        for i in ids:
            check_int("pieces: id", i)
            if not 0 <= i < size:
                raise ValueError(f"pieces: id {i} is outside the vocabulary's [0, {size})")
        return [self._processor.id_to_piece(i) for i in ids]

    def to_tensor(self) -> Tensor:
        """The serialized model as a 1-d uint8 tensor, the form a checkpoint stores."""
        return torch.frombuffer(bytearray(self.model_proto), dtype=torch.uint8)

    @classmethod
    def from_tensor(cls, tensor: Tensor) -> Vocabulary:
        """The vocabulary ``to_tensor`` stored."""
        if not isinstance(tensor, Tensor) or tensor.dtype != torch.uint8 or tensor.ndim != 1:
            raise ValueError("a stored vocabulary is a 1-d uint8 tensor, got "
                             f"{type(tensor).__name__} {getattr(tensor, 'dtype', '')}")
        return cls(tensor.numpy().tobytes())


def train_vocabulary(sentences: Iterable[str], settings: VocabularySettings) -> Vocabulary:
    """A sentencepiece model of ``settings`` trained on ``sentences`` (both languages together).

    Deterministic: one thread, every sentence read, none sampled. A size the sentences cannot
    fill is a ``ValueError``.
    """
    model = io.BytesIO()
    try:
        _sentencepiece().SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model, vocab_size=settings.size,
            model_type=settings.model_type, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID,
            character_coverage=1.0, normalization_rule_name="identity", num_threads=1,
            input_sentence_size=0, minloglevel=2,
        )
    except RuntimeError as error:  # e.g. "Vocabulary size is too high (8000). Should be <= 412."
        raise ValueError(f"cannot train a {settings.model_type} vocabulary of {settings.size} "
                         f"pieces: {str(error).strip().splitlines()[-1]}") from None
    return Vocabulary(model.getvalue())
