"""A parallel corpus from a manythings.org-style export (Tatoeba sentence pairs), normalised,
length-filtered and split by source sentence into train, valid and test.

    corpus = load_corpus(CorpusSettings("fra-eng.zip", max_words=8))
    corpus.train[0]              # Example(source='Go.', references=('Va !', 'Marche.', ...))
    corpus.pairs("train")        # [('Go.', 'Va !'), ('Go.', 'Marche.'), ...]

An export is a zip holding one ``*.txt`` (entries under ``__MACOSX/`` and files whose name
starts with ``_``, such as ``_about.txt``, are ignored) or that text file itself: UTF-8, one
pair per line, ``English<TAB>French``, newer exports adding a third column (an attribution),
which is dropped. Anything else is a ``ValueError`` naming the file and, where there is one, the
line.

Each sentence is Unicode-normalised (NFKC by default: the exports write the space before French
``!``, ``?``, ``:`` and ``;`` as U+202F, U+00A0 or a plain space from one line to the next, and
NFKC makes all of them one plain space, so a model is not scored on which space a translator
typed), runs of spaces become one and the ends are stripped.

The split is by source sentence, never by line: one English sentence often has several French
translations, and a line-level split would put some of them in training and others in the test
set. Each distinct English sentence lands in one split, chosen by a hash of the sentence and
``split_seed`` (so the split does not depend on the order of the lines, and a corpus that grows
keeps the old sentences where they were), and carries every French translation with it: the
test set is multi-reference.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from common.checks import check_int, check_number

SPLITS: tuple[str, ...] = ("train", "valid", "test")
ATTRIBUTION = "www.manythings.org/anki and tatoeba.org"  # what the Tatoeba exports ask to be credited
NORMALIZATIONS: tuple[str, ...] = ("NFC", "NFKC")


@dataclass(frozen=True)
class CorpusSettings:
    """Where the corpus is and how it is filtered and split."""

    path: str  # the export: the zip, or its tab-separated text file
    max_words: int = 8  # keep an English sentence of at most this many words, with all its translations
    valid_fraction: float = 0.02  # share of the distinct English sentences in the validation split
    test_fraction: float = 0.03  # share of the distinct English sentences in the test split
    split_seed: int = 0  # salts the hash that assigns each English sentence its split
    normalization: str = "NFKC"  # the Unicode normal form every sentence is put in (NFC or NFKC)

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise TypeError(f"CorpusSettings.path must be a non-empty str, got {self.path!r}")
        check_int("CorpusSettings.max_words", self.max_words, low=1)
        check_int("CorpusSettings.split_seed", self.split_seed)
        for name in ("valid_fraction", "test_fraction"):
            check_number(f"CorpusSettings.{name}", getattr(self, name), high=1.0)
        if self.valid_fraction + self.test_fraction >= 1.0:
            raise ValueError("CorpusSettings.valid_fraction + test_fraction must leave room for "
                             f"training, got {self.valid_fraction} + {self.test_fraction}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"CorpusSettings.normalization must be one of {', '.join(NORMALIZATIONS)}, "
                             f"got {self.normalization!r}")


class Example(NamedTuple):
    """One source sentence and every translation of it in the corpus."""

    source: str
    references: tuple[str, ...]  # in the order of the file, without repeats


@dataclass(frozen=True)
class Corpus:
    """The three splits; no source sentence is in two of them."""

    train: tuple[Example, ...]
    valid: tuple[Example, ...]
    test: tuple[Example, ...]

    def split(self, name: str) -> tuple[Example, ...]:
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; the splits are {', '.join(SPLITS)}")
        return getattr(self, name)

    def pairs(self, name: str) -> list[tuple[str, str]]:
        """(source, translation) pairs of a split: one per translation, the way training reads it."""
        return [(example.source, reference) for example in self.split(name)
                for reference in example.references]


def load_corpus(settings: CorpusSettings) -> Corpus:
    """Read, normalise, filter and split the export that ``settings.path`` names."""
    translations: dict[str, list[str]] = {}  # source -> its translations, in file order
    for source, target in read_pairs(settings.path):
        source, target = normalize(source, settings.normalization), normalize(target, settings.normalization)
        if len(source.split()) > settings.max_words:
            continue
        known = translations.setdefault(source, [])
        if target not in known:
            known.append(target)
    splits: dict[str, list[Example]] = {name: [] for name in SPLITS}
    for source, targets in translations.items():
        splits[split_of(source, settings)].append(Example(source, tuple(targets)))
    for name, examples in splits.items():
        if not examples:
            raise ValueError(f"{settings.path}: its {len(translations)} English sentences of at most "
                             f"{settings.max_words} words leave the {name} split empty; a larger "
                             "corpus (or a larger fraction) is needed")
    return Corpus(**{name: tuple(examples) for name, examples in splits.items()})


def split_of(source: str, settings: CorpusSettings) -> str:
    """The split a source sentence belongs to: a uniform number from its salted hash, cut at the
    valid and test fractions."""
    digest = hashlib.blake2b(f"{settings.split_seed}\t{source}".encode(), digest_size=8).digest()
    position = int.from_bytes(digest, "big") / 2**64  # uniform in [0, 1)
    if position < settings.valid_fraction:
        return "valid"
    if position < settings.valid_fraction + settings.test_fraction:
        return "test"
    return "train"


_SPACES = re.compile(" +")


def normalize(text: str, form: str = "NFKC") -> str:
    """``text`` in Unicode normal form ``form``, runs of spaces made one, the ends stripped.

    Only the plain space is collapsed: under NFC a U+202F stays what it is.
    """
    return _SPACES.sub(" ", unicodedata.normalize(form, text)).strip(" ")


def read_pairs(path: str | Path) -> list[tuple[str, str]]:
    """The (English, French) pairs of an export, as written (not normalised), in file order.

    Lines end in LF, CRLF or a lone CR (universal newlines). A blank line is skipped; a UTF-16
    or UTF-32 file (named as such), a NUL byte, a truncated zip, a line without two non-empty
    tab-separated columns (a third, the attribution, is dropped), bytes that are not UTF-8, a
    missing file, an unreadable zip and a file without a single pair are each a ``ValueError``
    naming the file (and the line).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file (expected a manythings.org export: the zip or its .txt)")
    if zipfile.is_zipfile(path):
        name, data = _text_in_zip(path)
        where = f"{path}:{name}"
    else:
        data, where = path.read_bytes(), str(path)
        if data.startswith(b"PK\x03\x04"):  # a zip's first entry, without its directory at the end
            raise ValueError(f"{path}: a damaged zip (truncated, or not fully downloaded?): "
                             "its central directory is missing")
    if encoding := _wide_encoding(data):
        raise ValueError(f"{where}: looks like {encoding}; convert it to UTF-8 (an export is UTF-8 text)")
    pairs = []
    # universal line ends, as Python's text files read them: LF, CRLF and a lone CR
    for number, raw in enumerate(data.splitlines(), start=1):
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark
            raw = raw[3:]
        if (column := raw.find(b"\0")) >= 0:
            raise ValueError(f"{where}, line {number}: holds a NUL byte (column {column + 1}); "
                             "not a text export")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{where}, line {number}: not UTF-8 (byte {raw[error.start]:#04x} at "
                             f"column {error.start + 1})") from None
        if not line.strip():
            continue
        columns = line.split("\t")
        if len(columns) not in (2, 3):
            raise ValueError(f"{where}, line {number}: expected 2 or 3 tab-separated columns "
                             f"(English, French, attribution), found {len(columns)}")
        if not columns[0].strip() or not columns[1].strip():
            side = "English" if not columns[0].strip() else "French"
            raise ValueError(f"{where}, line {number}: the {side} sentence is empty")
        pairs.append((columns[0], columns[1]))
    if not pairs:
        raise ValueError(f"{where}: holds no sentence pairs (an empty export?)")
    return pairs


# byte-order marks, UTF-32's before UTF-16's (UTF-32 LE's starts with UTF-16 LE's)
_BYTE_ORDER_MARKS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
                     (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"))


def _wide_encoding(data: bytes) -> str | None:
    """"UTF-16" or "UTF-32" for text that starts with that encoding's byte-order mark, "UTF-16"
    for text without one whose first bytes hold a NUL in every other byte at least half the time
    and none in between (Latin text in UTF-16), else None."""
    for mark, encoding in _BYTE_ORDER_MARKS:
        if data.startswith(mark):
            return encoding
    sample = data[:256]
    for nuls, others in ((sample[0::2], sample[1::2]), (sample[1::2], sample[0::2])):
        if len(nuls) >= 2 and 2 * nuls.count(0) >= len(nuls) and 0 not in others:
            return "UTF-16"
    return None


def _text_in_zip(path: Path) -> tuple[str, bytes]:
    """The one data file of a zipped export: a ``*.txt`` outside ``__MACOSX/`` not named ``_*``."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [name for name in archive.namelist()
                     if name.endswith(".txt") and not name.startswith("__MACOSX/")
                     and not Path(name).name.startswith(("_", "."))]
            if len(names) != 1:
                found = ", ".join(names) or "none"
                raise ValueError(f"{path}: expected one sentence file (*.txt) in the zip, found {found}")
            return names[0], archive.read(names[0])
    except (zipfile.BadZipFile, OSError) as error:
        raise ValueError(f"{path}: not a readable zip ({error})") from None
