"""The tokenizers of the two families, carried inside the model file as plain data, so that
``python -m seq2seq.translate`` needs neither transformers nor the checkpoint's folder.

    tokenizer = MarianTokenizer.from_folder("opus-mt-en-de/")   # source.spm, target.spm, vocab.json
    record = tokenizer.to_record()                             # plain data: ModelFile.tokenizer
    tokenizer = tokenizer_from_record(record)                  # the same tokenizer, anywhere
    ids = tokenizer.encode(["Hello."])                         # source pieces' ids, no EOS
    tokenizer.decode([[...]])                                  # target ids -> text

Each reproduces what Hugging Face's tokenizer of the family does for translation: the ids of
``tokenizer(texts)`` without its EOS, and ``batch_decode(ids, skip_special_tokens=True)``.

- **Marian** (Helsinki-NLP opus-mt, ``MarianTokenizer``): a source sentence is split into pieces
  by the source sentencepiece model (a leading language code such as ``>>fr<<`` stays one
  piece), and each piece is looked up in ``vocab.json`` (unknown: ``<unk>``); the ids are those of
  the model, not of either sentencepiece model. Output ids go back to pieces through the target
  vocabulary (``target_vocab.json`` where the checkpoint has two) and are joined by the target
  sentencepiece model. EOS is ``</s>``, the decoder starts with ``<pad>`` (opus-mt's), or with
  ``</s>`` where the model's config says so (``start``).
- **fairseq** (WMT19, ``FSMTTokenizer``): Moses punctuation normalisation and tokenisation of
  the source language (``sacremoses``, the ``hf`` extra), then byte-pair merges (``merges.txt``,
  subword-nmt's ``</w>`` word ends), looked up in ``vocab-src.json``; output ids go back
  through ``vocab-tgt.json``, the merges are undone and Moses detokenises the target language.
  EOS is ``</s>``, and the decoder starts with it.

Both drop the special ids (padding, EOS, unknown, BOS) when decoding, as ``skip_special_tokens``
does, and apply Hugging Face's ``clean_up_tokenization_spaces`` where the checkpoint's
tokenizer does.

A folder this project exported (``seq2seq.hub.to_hf``) holds its joint sentencepiece vocabulary
as Marian's: ``joint_vocabulary`` recognises it, so that the converter gives the model file its
vocabulary back (``seq2seq.data.subwords.Vocabulary``, whose decoder starts with BOS).
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

from common.checks import check_int
from common.files import read_bytes, read_json, read_text
from seq2seq.data.subwords import Vocabulary

KINDS = ("marian", "fairseq")
LANGUAGE_CODE = re.compile(r">>.+?<<")  # a multilingual opus-mt model's target tag, e.g. >>fr<<
UNK, PAD, EOS, BOS = "<unk>", "<pad>", "</s>", "<s>"
# TransformerConfig.decoder_start -> the piece a Marian decoder starts with (files written before
# the choice start with padding)
MARIAN_STARTS = {"pad": PAD, "eos": EOS}


def sentencepiece_module():
    """The sentencepiece module, or an ImportError naming the extra that installs it."""
    try:
        import sentencepiece
    except ImportError as error:
        raise ImportError('a Marian tokenizer needs sentencepiece: pip install -e ".[translate]"') from error
    return sentencepiece


def sacremoses_module():
    """The sacremoses module, or an ImportError naming the extra that installs it."""
    try:
        import sacremoses
    except ImportError as error:
        raise ImportError('a fairseq (FSMT) tokenizer needs sacremoses: pip install -e ".[hf]"') from error
    return sacremoses


def _bytes_tensor(data: bytes) -> Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _read_json(path: Path) -> dict[str, int]:
    return read_json(path, dict, "a vocabulary (piece -> id)")


def clean_up_spaces(text: str) -> str:
    """Hugging Face's ``clean_up_tokenization`` (English-centred: " ." -> ".", " 's" -> "'s", ...)."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                          (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


class _Tokenizer:
    """What both families share: the special ids, the sizes, decoding's id checks."""

    kind: str
    pad_id: int  # the padding id (opus-mt's decoder also starts with it)
    eos_id: int  # ends a source, and a translation
    start_id: int  # the decoder's first id
    special_ids: frozenset[int]  # what decoding leaves out
    clean_up: bool  # apply clean_up_spaces to decoded text

    @property
    def source_size(self) -> int:
        return len(self.source_vocab)

    @property
    def target_size(self) -> int:
        return len(self.target_vocab)

    def _target_pieces(self, ids: Sequence[Sequence[int]]) -> list[list[str]]:
        """Each row's pieces, the special ids left out; an id outside the target vocabulary is a
        ``ValueError``."""
        rows = []
        for number, row in enumerate(ids):
            for i in row:
                check_int(f"decode: row {number}'s id", i)
                if not 0 <= i < self.target_size:
                    raise ValueError(f"decode: row {number} holds id {i}, outside the target vocabulary's "
                                     f"[0, {self.target_size})")
            rows.append([self._target_piece.get(int(i), UNK) for i in row if i not in self.special_ids])
        return rows


class MarianTokenizer(_Tokenizer):
    """Marian's two sentencepiece models and its vocabulary of the model's ids (see the module
    docstring)."""

    kind = "marian"

    def __init__(self, source_spm: bytes, target_spm: bytes, source_vocab: Mapping[str, int],
                 target_vocab: Mapping[str, int] | None = None, *, clean_up: bool = False,
                 start: str = "pad") -> None:
        sentencepiece = sentencepiece_module()
        self.source_spm, self.target_spm = source_spm, target_spm
        self._source = sentencepiece.SentencePieceProcessor()
        self._target = sentencepiece.SentencePieceProcessor()
        for processor, proto, which in ((self._source, source_spm, "source"),
                                        (self._target, target_spm, "target")):
            try:
                processor.LoadFromSerializedProto(proto)
            except RuntimeError as error:
                raise ValueError(f"the {which} sentencepiece model is not one ({error})") from None
        self.source_vocab = dict(source_vocab)
        self.target_vocab = dict(source_vocab if target_vocab is None else target_vocab)
        self.separate = target_vocab is not None
        for name in (UNK, PAD, EOS):
            if name not in self.source_vocab or name not in self.target_vocab:
                raise ValueError(f"a Marian vocabulary needs {name}; it is missing")
        self.unk_id, self.pad_id, self.eos_id = (self.source_vocab[name] for name in (UNK, PAD, EOS))
        # the decoder's first id: opus-mt's padding, or EOS (TransformerConfig.decoder_start)
        if start not in MARIAN_STARTS:
            raise ValueError(f"a Marian decoder starts with {' or '.join(MARIAN_STARTS)}, got {start!r}")
        self.start = start
        self.start_id = self.target_vocab[MARIAN_STARTS[start]]
        self.special_ids = frozenset(self.target_vocab[name] for name in (UNK, PAD, EOS))
        self._target_piece = {i: piece for piece, i in self.target_vocab.items()}
        self.clean_up = clean_up

    @classmethod
    def from_folder(cls, folder: str | Path, clean_up: bool = False, start: str = "pad") -> MarianTokenizer:
        folder = Path(folder)
        target = folder / "target_vocab.json"
        return cls(read_bytes(folder / "source.spm"), read_bytes(folder / "target.spm"),
                   _read_json(folder / "vocab.json"), _read_json(target) if target.is_file() else None,
                   clean_up=clean_up, start=start)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Each source text's ids, without EOS."""
        if isinstance(texts, str):
            raise TypeError("encode takes a sequence of texts, got one str")
        rows = []
        for text in texts:
            code = LANGUAGE_CODE.match(text) if text.startswith(">>") else None
            pieces = [code.group()] if code else []
            pieces += self._source.encode(text[code.end():] if code else text, out_type=str)
            rows.append([self.source_vocab.get(piece, self.unk_id) for piece in pieces])
        return rows

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """The text of each row of target ids; the special ids are left out."""
        texts = []
        for pieces in self._target_pieces(ids):
            text = self._target.decode_pieces(pieces).replace("\u2581", " ").strip()
            texts.append(clean_up_spaces(text) if self.clean_up else text)
        return texts

    def to_record(self) -> dict[str, object]:
        return {"kind": self.kind, "source_spm": _bytes_tensor(self.source_spm),
                "target_spm": _bytes_tensor(self.target_spm), "source_vocab": self.source_vocab,
                "target_vocab": self.target_vocab if self.separate else None, "clean_up": self.clean_up,
                "start": self.start}


class FairseqTokenizer(_Tokenizer):
    """fairseq's Moses + BPE pipeline with its two vocabularies (see the module docstring)."""

    kind = "fairseq"

    def __init__(self, source_language: str, target_language: str, merges: Sequence[tuple[str, str]],
                 source_vocab: Mapping[str, int], target_vocab: Mapping[str, int], *,
                 lower_case: bool = False, clean_up: bool = False) -> None:
        self._moses = sacremoses_module()
        self.source_language, self.target_language = source_language, target_language
        self.merges = [tuple(pair) for pair in merges]
        self._rank = {pair: rank for rank, pair in enumerate(self.merges)}
        self.source_vocab, self.target_vocab = dict(source_vocab), dict(target_vocab)
        for name in (UNK, PAD, EOS, BOS):
            if name not in self.source_vocab or name not in self.target_vocab:
                raise ValueError(f"a fairseq vocabulary needs {name}; it is missing")
        self.unk_id, self.pad_id, self.eos_id = (self.source_vocab[name] for name in (UNK, PAD, EOS))
        self.start_id = self.target_vocab[EOS]
        self.special_ids = frozenset(self.target_vocab[name] for name in (UNK, PAD, EOS, BOS))
        self._target_piece = {i: piece for piece, i in self.target_vocab.items()}
        self.lower_case, self.clean_up = lower_case, clean_up
        self._normalizer = self._moses.MosesPunctNormalizer(lang=source_language)
        self._tokenizer = self._moses.MosesTokenizer(lang=source_language)
        self._detokenizer = self._moses.MosesDetokenizer(lang=target_language)

    @classmethod
    def from_folder(cls, folder: str | Path, languages: Sequence[str], *, lower_case: bool = False,
                    clean_up: bool = False) -> FairseqTokenizer:
        folder = Path(folder)
        lines = read_text(folder / "merges.txt").split("\n")[:-1]
        merges = [tuple(line.split()[:2]) for line in lines]
        return cls(languages[0], languages[1], merges, _read_json(folder / "vocab-src.json"),
                   _read_json(folder / "vocab-tgt.json"), lower_case=lower_case, clean_up=clean_up)

    def _words(self, text: str) -> list[str]:
        """Moses: unicode punctuation replaced, punctuation normalised, non-printing characters
        dropped, then tokenised (dashes split, XML characters escaped)."""
        if self.lower_case:
            text = text.lower()
        text = self._normalizer.normalize(_replace_unicode_punctuation(text))
        text = "".join(char for char in text if not unicodedata.category(char).startswith("C"))
        return self._tokenizer.tokenize(text, aggressive_dash_splits=True, return_str=False, escape=True)

    def _bpe(self, word: str) -> list[str]:
        """subword-nmt's merges: the word's characters, the last marked ``</w>``; the lowest-ranked
        adjacent pair is merged, every occurrence left to right, until no pair has a rank."""
        symbols = [*word[:-1], word[-1] + "</w>"]
        while len(symbols) > 1:
            pairs = set(itertools.pairwise(symbols))
            best = min(pairs, key=lambda pair: self._rank.get(pair, len(self._rank)))
            if best not in self._rank:
                break
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        return symbols

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Each source text's ids, without EOS."""
        if isinstance(texts, str):
            raise TypeError("encode takes a sequence of texts, got one str")
        return [[self.source_vocab.get(piece, self.unk_id)
                 for word in self._words(text) if word for piece in self._bpe(word)] for text in texts]

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """The text of each row of target ids; the special ids are left out."""
        texts = []
        for pieces in self._target_pieces(ids):
            words = "".join(piece.replace(" ", "").replace("</w>", " ") for piece in pieces).split()
            text = self._detokenizer.detokenize(words)
            texts.append(clean_up_spaces(text) if self.clean_up else text)
        return texts

    def to_record(self) -> dict[str, object]:
        return {"kind": self.kind, "languages": [self.source_language, self.target_language],
                "merges": ["\t".join(pair) for pair in self.merges], "source_vocab": self.source_vocab,
                "target_vocab": self.target_vocab, "lower_case": self.lower_case, "clean_up": self.clean_up}


def _replace_unicode_punctuation(text: str) -> str:
    """Moses' replace-unicode-punctuation.perl, as Hugging Face's FSMT tokenizer ports it."""
    text = re.sub(r"。\s*", ". ", text)
    text = re.sub(r"．\s*", ". ", text)
    return text.translate(_UNICODE_PUNCTUATION)


_UNICODE_PUNCTUATION = str.maketrans({
    "，": ",", "、": ",", "”": '"', "“": '"', "∶": ":", "：": ":", "？": "?", "《": '"', "》": '"',
    "）": ")", "！": "!", "（": "(", "；": ";", "」": '"', "「": '"', "～": "~", "’": "'", "…": "...",
    "━": "-", "〈": "<", "〉": ">", "【": "[", "】": "]", "％": "%",
    **{chr(0xFF10 + digit): str(digit) for digit in range(10)},  # full-width digits
})


def tokenizer_from_record(record: Mapping[str, object]) -> MarianTokenizer | FairseqTokenizer:
    """The tokenizer a model file's ``tokenizer`` field holds (``to_record``'s form); a record
    that is not one is a ``ValueError`` naming what is wrong."""
    if not isinstance(record, Mapping) or record.get("kind") not in KINDS:
        kind = record.get("kind") if isinstance(record, Mapping) else type(record).__name__
        raise ValueError(f"a stored tokenizer's kind must be one of {', '.join(KINDS)}, got {kind!r}")
    try:
        if record["kind"] == "marian":
            return MarianTokenizer(_bytes(record["source_spm"]), _bytes(record["target_spm"]),
                                   record["source_vocab"], record["target_vocab"],
                                   clean_up=record["clean_up"], start=record.get("start", "pad"))
        return FairseqTokenizer(*record["languages"], [tuple(line.split("\t")) for line in record["merges"]],
                                record["source_vocab"], record["target_vocab"],
                                lower_case=record["lower_case"], clean_up=record["clean_up"])
    except KeyError as error:
        raise ValueError(f"a stored {record['kind']} tokenizer lacks its {error.args[0]!r}") from None


def _bytes(tensor: object) -> bytes:
    if not isinstance(tensor, Tensor) or tensor.dtype != torch.uint8 or tensor.ndim != 1:
        raise ValueError("a stored sentencepiece model is a 1-d uint8 tensor")
    return tensor.numpy().tobytes()


def piece_ids(vocabulary: Vocabulary) -> dict[str, int]:
    """This project's joint vocabulary as Marian's ``vocab.json``: each piece -> its own id."""
    return {piece: i for i, piece in enumerate(vocabulary.pieces(range(vocabulary.size)))}


def joint_vocabulary(tokenizer: MarianTokenizer) -> Vocabulary | None:
    """The project's joint sentencepiece vocabulary where ``tokenizer`` is one written as Marian's
    (``seq2seq.hub.to_hf``): one sentencepiece model on both sides, with this project's special
    ids, and one vocabulary mapping each of its pieces to its own id; else None."""
    if tokenizer.separate or tokenizer.source_spm != tokenizer.target_spm:
        return None
    try:
        vocabulary = Vocabulary(tokenizer.source_spm)
    except ValueError:  # another sentencepiece model's special ids
        return None
    return vocabulary if tokenizer.source_vocab == piece_ids(vocabulary) else None
