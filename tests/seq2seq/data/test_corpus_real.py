"""The corpus loader on the real Tatoeba English-French export in ../shared/data (development
and CI only; never committed): its counts, and no English sentence in two splits."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest

from seq2seq.data.corpus import SPLITS, CorpusSettings, load_corpus, read_pairs

EXPORT = Path(__file__).resolve().parents[4] / "shared" / "data" / "tatoeba-eng-fra" / "fra-eng.zip"
PAIRS, DISTINCT_ENGLISH = 167_130, 116_830  # what the export's README states


@pytest.mark.slow
@pytest.mark.skipif(not EXPORT.is_file(), reason=f"the Tatoeba export is not at {EXPORT} "
                    "(development and CI data only, never committed)")
def test_the_real_export_loads_with_its_counts_and_splits_without_leaks():
    pairs = read_pairs(EXPORT)
    assert len(pairs) == PAIRS
    assert len({english for english, _ in pairs}) == DISTINCT_ENGLISH
    corpus = load_corpus(CorpusSettings(str(EXPORT), max_words=8))
    # the expected sentences and translations, computed here from the raw pairs
    def normal(text: str) -> str:  # NFKC, runs of spaces made one, ends stripped
        return " ".join(part for part in unicodedata.normalize("NFKC", text).split(" ") if part)

    expected: dict[str, set[str]] = {}
    for english, french in pairs:
        if len(normal(english).split()) <= 8:
            expected.setdefault(normal(english), set()).add(normal(french))
    sources = {name: {example.source for example in corpus.split(name)} for name in SPLITS}
    assert sum(len(found) for found in sources.values()) == len(expected)
    assert set.union(*sources.values()) == set(expected)  # and so no sentence is in two splits
    for name in SPLITS:
        assert all(set(example.references) == expected[example.source] for example in corpus.split(name))
    for name, share in (("valid", 0.02), ("test", 0.03)):  # a hash cut: near the asked fraction
        assert abs(len(sources[name]) / len(expected) - share) < 0.003, (name, len(sources[name]))
    assert any("\u202f" in french for _, french in pairs)
    assert not any("\u202f" in r for example in corpus.test for r in example.references)  # NFKC
