"""Translation's library on a tiny corpus the tests write (``sample_corpus``): the split by
English sentence, the subword vocabulary, bad files, the batch stream, BLEU through the
project's path, and a model file that translates on its own."""

from __future__ import annotations

import dataclasses
import random
import unicodedata
import zipfile

import pytest
import torch

from seq2seq.data.batches import TokenBatches, TranslationData, encode_pairs
from seq2seq.data.corpus import SPLITS, CorpusSettings, load_corpus, normalize, read_pairs
from seq2seq.data.ids import BOS_ID, EOS_ID, PAD_ID
from seq2seq.data.subwords import Vocabulary, VocabularySettings, train_vocabulary
from seq2seq.evaluation import corpus_scores
from seq2seq.pipeline import (
    TranslationSettings,
    evaluate,
    train_translation,
    training_sentences,
    translate_sentences,
)
from seq2seq.storage.model_file import ModelFile, _digest, build_model, load, save
from seq2seq.training.trainer import Trainer
from tests.seq2seq.conftest import write_export
from variants import build

WIDE_SPLIT = dict(valid_fraction=0.2, test_fraction=0.2)  # every split well filled on 243 sentences


def expected_translations(pairs, form="NFKC", max_words=8) -> dict[str, set[str]]:
    """English -> its French translations, computed here from the raw pairs."""
    found: dict[str, set[str]] = {}
    for english, french in pairs:
        if len(normal(english, form).split()) <= max_words:
            found.setdefault(normal(english, form), set()).add(normal(french, form))
    return found


def normal(text: str, form: str = "NFKC") -> str:
    """``form`` of ``text``, runs of plain spaces made one, ends stripped: written apart from
    ``seq2seq.data.corpus.normalize``, which the tests check."""
    return " ".join(part for part in unicodedata.normalize(form, text).split(" ") if part)


# --- the split ----------------------------------------------------------------------------


def test_split_leaks_no_english_sentence_and_keeps_every_reference(sample_corpus):
    corpus = load_corpus(CorpusSettings(str(sample_corpus.path), **WIDE_SPLIT))
    sources = {name: [example.source for example in corpus.split(name)] for name in SPLITS}
    for name in SPLITS:
        assert sources[name] and len(set(sources[name])) == len(sources[name]), name
    train, valid, test = (set(sources[name]) for name in SPLITS)
    assert not train & valid and not train & test and not valid & test
    expected = expected_translations(sample_corpus.pairs)
    assert train | valid | test == set(expected)  # the long sentence filtered, nothing else lost
    for name in SPLITS:
        for example in corpus.split(name):
            assert set(example.references) == expected[example.source], example
    several = [example for example in corpus.train + corpus.valid + corpus.test
               if len(example.references) > 1]
    assert len(several) == 6 * 10 + 2  # every "likes" sentence, "Run!" and "Help!"
    assert len(corpus.pairs("test")) == sum(len(expected[source]) for source in test)


def test_split_is_deterministic_and_ignores_line_order(sample_corpus, tmp_path):
    settings = CorpusSettings(str(sample_corpus.path), **WIDE_SPLIT)
    first, again = load_corpus(settings), load_corpus(settings)
    assert first == again
    shuffled = list(sample_corpus.pairs)
    random.Random(0).shuffle(shuffled)
    other = load_corpus(dataclasses.replace(settings, path=str(write_export(tmp_path / "fra.txt", shuffled))))
    for name in SPLITS:
        assert {e.source for e in other.split(name)} == {e.source for e in first.split(name)}
    reseeded = load_corpus(dataclasses.replace(settings, split_seed=1))
    assert {e.source for e in reseeded.test} != {e.source for e in first.test}


def test_max_words_filters_by_english_length(sample_corpus):
    corpus = load_corpus(CorpusSettings(str(sample_corpus.path), max_words=11, **WIDE_SPLIT))
    everything = {e.source for name in SPLITS for e in corpus.split(name)}
    assert len(everything) == len(expected_translations(sample_corpus.pairs, max_words=11))
    assert normalize(sample_corpus.pairs[-1][0]) in everything  # the 11-word sentence


def test_normalisation_composes_and_unifies_the_spaces_before_punctuation(sample_corpus):
    nfkc = load_corpus(CorpusSettings(str(sample_corpus.path), **WIDE_SPLIT))
    nfc = load_corpus(CorpusSettings(str(sample_corpus.path), normalization="NFC", **WIDE_SPLIT))
    nfkc_text = {r for e in nfkc.train + nfkc.valid + nfkc.test for r in e.references}
    nfc_text = {r for e in nfc.train + nfc.valid + nfc.test for r in e.references}
    assert "Cours !" in nfkc_text and "À l'aide !" in nfkc_text  # U+202F, U+00A0 -> " "
    assert "Cours\u202f!" in nfc_text and "À l'aide\u00a0!" in nfc_text
    assert not any("e\u0300" in text for text in nfc_text)  # "père" composed in both
    assert any("père" in text for text in nfc_text)


# --- bad files ----------------------------------------------------------------------------


@pytest.mark.parametrize(("content", "message"), [
    (b"", r"holds no sentence pairs"),
    (b"\n\n", r"holds no sentence pairs"),
    (b"Go.\tVa !\nHi.\tSalut.\nno tab here\n", r"line 3: expected 2 or 3 tab-separated columns .* found 1"),
    (b"Go.\tVa !\ta\tb\n", r"line 1: expected 2 or 3 .* found 4"),
    (b"Go.\tVa !\nHi.\t\n", r"line 2: the French sentence is empty"),
    (b"Go.\tVa !\nCaf\xe9.\tCaf\xe9.\n", r"line 2: not UTF-8 \(byte 0xe9 at column 4\)"),
])
def test_a_bad_file_names_itself_and_the_line(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"bad\.txt.*{message}"):
        read_pairs(path)


def test_a_missing_file_or_a_zip_without_sentences_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"nowhere\.zip: no such file"):
        load_corpus(CorpusSettings(str(tmp_path / "nowhere.zip")))
    archive = tmp_path / "empty.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("fra-eng/_about.txt", "terms")
        zipped.writestr("__MACOSX/fra-eng/._fra.txt", "resource fork")
    with pytest.raises(ValueError, match=r"empty\.zip: expected one sentence file .* found none"):
        read_pairs(archive)
    bad_line = tmp_path / "line.zip"
    with zipfile.ZipFile(bad_line, "w") as zipped:
        zipped.writestr("fra-eng/fra.txt", "Go.\tVa !\nno tab\n")
        zipped.writestr("__MACOSX/fra-eng/._fra.txt", "resource fork")
    with pytest.raises(ValueError, match=r"line\.zip:fra-eng/fra\.txt, line 2: expected 2 or 3"):
        read_pairs(bad_line)


def test_the_zip_and_its_text_file_give_the_same_pairs(sample_corpus, tmp_path):
    archive = tmp_path / "fra-eng.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.write(sample_corpus.path, "fra-eng/fra.txt")
        zipped.writestr("fra-eng/_about.txt", "terms")
        zipped.writestr("__MACOSX/fra-eng/._fra.txt", "resource fork")
    assert read_pairs(archive) == list(sample_corpus.pairs) == read_pairs(sample_corpus.path)


# --- the vocabulary -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(sample_corpus):
    return load_corpus(CorpusSettings(str(sample_corpus.path)))


@pytest.fixture(scope="module")
def vocabulary(corpus) -> Vocabulary:
    return train_vocabulary(training_sentences(corpus), VocabularySettings(size=120))


@pytest.mark.parametrize("form", ["NFKC", "NFC"])
def test_subwords_round_trip_every_sample_sentence(sample_corpus, form):
    corpus = load_corpus(CorpusSettings(str(sample_corpus.path), normalization=form, **WIDE_SPLIT))
    sentences = [s for name in SPLITS for e in corpus.split(name) for s in (e.source, *e.references)]
    vocabulary = train_vocabulary(sentences, VocabularySettings(size=100))
    normalised = [normal(s, form) for pair in sample_corpus.pairs[:-1] for s in pair]
    assert vocabulary.decode(vocabulary.encode(normalised)) == normalised
    assert any("\u202f" in s for s in normalised) == (form == "NFC")
    ids = [i for row in vocabulary.encode(normalised) for i in row]
    assert min(ids) > EOS_ID and 3 not in ids  # no PAD/BOS/EOS inside a sentence, nothing unknown
    assert vocabulary.size == 100


def test_the_vocabulary_uses_the_project_ids_and_survives_its_tensor_form(vocabulary):
    assert (PAD_ID, BOS_ID, EOS_ID) == (0, 1, 2)
    again = Vocabulary.from_tensor(vocabulary.to_tensor())
    text = ["The dog likes the sea.", "Cours !"]
    assert again.encode(text) == vocabulary.encode(text)
    assert vocabulary.decode([[BOS_ID, *vocabulary.encode(["Cours !"])[0], EOS_ID, PAD_ID]]) == ["Cours !"]
    with pytest.raises(ValueError, match="too high"):
        train_vocabulary(["a b c"], VocabularySettings(size=500))


def test_vocabulary_is_trained_on_the_train_split_only(corpus):
    sentences = list(training_sentences(corpus))
    assert set(sentences) == {s for e in corpus.train for s in (e.source, *e.references)}
    assert not {e.source for e in corpus.test} & set(sentences)


# --- scores ---------------------------------------------------------------------------------


def test_bleu_is_100_for_a_perfect_hypothesis_and_0_for_an_empty_one():
    references = [["Le chat voit la maison.", "Le chat regarde la maison."], ["Merci beaucoup !"]]
    perfect = corpus_scores(["Le chat regarde la maison.", "Merci beaucoup !"], references)
    assert perfect.bleu == pytest.approx(100.0) and perfect.chrf == pytest.approx(100.0)
    assert "nrefs:var" in perfect.bleu_signature and "tok:13a" in perfect.bleu_signature
    empty = corpus_scores(["", ""], references)
    assert empty.bleu == 0.0 and empty.chrf == 0.0
    single = corpus_scores(["Le chat regarde la maison.", "Merci beaucoup !"],
                           [[refs[0]] for refs in references])
    assert single.bleu < 100.0  # only the second reference made the first hypothesis perfect
    with pytest.raises(ValueError, match="1 hypotheses but 2 reference sets"):
        corpus_scores(["x"], references)


# --- the batch stream -------------------------------------------------------------------------


def data_settings(sample_corpus, **changes) -> TranslationData:
    fields = dict(corpus=CorpusSettings(str(sample_corpus.path)), vocabulary=VocabularySettings(120),
                  batch_tokens=200, pool_size=64, seed=0)
    return TranslationData(**{**fields, **changes})


def test_token_batches_are_seeded_within_budget_and_resumable(sample_corpus, corpus, vocabulary):
    encoded = encode_pairs(vocabulary, corpus.pairs("train"))
    stream = TokenBatches(encoded, data_settings(sample_corpus))
    batches = [next(stream) for _ in range(6)]
    for src, tgt in batches:
        assert src.shape[0] * (src.shape[1] + tgt.shape[1]) <= 200
        assert (tgt[:, 0] == BOS_ID).all() and (src[:, 0] != PAD_ID).all()
        assert ((src == EOS_ID).sum(dim=1) == 1).all() and ((tgt == EOS_ID).sum(dim=1) == 1).all()
    replay = TokenBatches(encoded, data_settings(sample_corpus))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
               for a, b in zip(batches, [next(replay) for _ in range(6)], strict=True))
    resumed = TokenBatches(encoded, data_settings(sample_corpus, seed=5))
    resumed.generator.set_state(TokenBatches(encoded, data_settings(sample_corpus)).generator.get_state())
    again = TokenBatches(encoded, data_settings(sample_corpus))
    for _ in range(3):
        next(again)
    state = again.generator.get_state()
    later = TokenBatches(encoded, data_settings(sample_corpus, seed=9))
    later.generator.set_state(state)
    assert all(torch.equal(x, y) for x, y in zip(next(later), batches[3], strict=True))
    other = TokenBatches(encoded, data_settings(sample_corpus, seed=1))
    assert not torch.equal(next(other)[0], batches[0][0])
    with pytest.raises(ValueError, match="cannot hold the longest pair"):
        TokenBatches(encoded, data_settings(sample_corpus, batch_tokens=8))


def test_the_text_round_trips_through_the_encoded_pairs(corpus, vocabulary):
    pairs = corpus.pairs("valid")
    encoded = encode_pairs(vocabulary, pairs)
    assert vocabulary.decode([ids.tolist() for ids in encoded.sources]) == [s for s, _ in pairs]
    assert vocabulary.decode([ids.tolist() for ids in encoded.targets]) == [t for _, t in pairs]
    assert all(ids[-1] == EOS_ID for ids in encoded.sources)
    assert all(ids[0] == BOS_ID and ids[-1] == EOS_ID for ids in encoded.targets)


# --- a run ----------------------------------------------------------------------------------

# max_seq_len bounds the decoding of an untrained model, which rarely says EOS
TINY = TranslationSettings(vocabulary_size=120, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                           dropout=0.0, max_seq_len=24, batch_tokens=200, pool_size=64,
                           warmup=5, steps=4)


def tiny_trainer(sample_corpus, corpus, vocabulary, seed=0) -> Trainer:
    data = data_settings(sample_corpus)
    model = build("explicit", TINY.config(), seed=seed)
    return Trainer(model, TokenBatches(encode_pairs(vocabulary, corpus.pairs("train")), data), TINY.recipe())


def test_a_run_stops_at_its_steps_or_its_minutes(sample_corpus, corpus, vocabulary):
    trainer = tiny_trainer(sample_corpus, corpus, vocabulary)
    assert len(train_translation(trainer, TINY)) == 4 and trainer.step == 4
    assert trainer.model.config.share_embeddings
    quick = tiny_trainer(sample_corpus, corpus, vocabulary)
    assert len(train_translation(quick, TINY.replace(minutes=1e-9))) == 1 and quick.step == 1


def test_time_spent_in_on_step_is_neither_budget_nor_reported(sample_corpus, corpus, vocabulary):
    """On a clock of the test's own: each batch takes 0.2 s of training, each validation 30 s.
    A budget of 0.5 s ends at the first step past it (the third, at 0.6 s), and the reports
    count training time alone; were the validations counted, the first step would end it."""
    trainer = tiny_trainer(sample_corpus, corpus, vocabulary)
    now = [100.0]  # any start: only differences count
    batches = trainer.batches

    def timed_batches():
        while True:
            now[0] += 0.2
            yield next(batches)

    trainer.batches = timed_batches()
    reports = []

    def slow_validation(report):
        reports.append(report)
        now[0] += 30.0

    train_translation(trainer, TINY.replace(minutes=0.5 / 60), on_step=slow_validation, clock=lambda: now[0])
    assert [report.step for report in reports] == [1, 2, 3]  # TINY has 4 steps; the budget ended it
    assert [report.seconds for report in reports] == pytest.approx([0.2, 0.4, 0.6])


def test_a_checkpointed_translation_run_resumes_exactly(sample_corpus, corpus, vocabulary):
    straight = tiny_trainer(sample_corpus, corpus, vocabulary)
    straight.run(4)
    first = tiny_trainer(sample_corpus, corpus, vocabulary)
    first.run(2)
    checkpoint = first.checkpoint("explicit")
    assert checkpoint.settings["data"]["corpus"]["max_words"] == 8
    second = tiny_trainer(sample_corpus, corpus, vocabulary, seed=3)
    second.restore(checkpoint, "explicit")
    second.run(4)
    for name, tensor in straight.model.state_dict().items():
        torch.testing.assert_close(second.model.state_dict()[name], tensor, rtol=0, atol=0)


def test_a_model_file_translates_without_its_corpus(sample_corpus, corpus, vocabulary, tmp_path):
    trainer = tiny_trainer(sample_corpus, corpus, vocabulary)
    trainer.run(2)
    checkpoint = dataclasses.replace(trainer.checkpoint("explicit"), vocabulary=vocabulary.to_tensor())
    path = save(checkpoint, tmp_path / "model.pt")
    sentences = ["The cat sees the sea.", "Help!"]
    expected = translate_sentences(trainer.model, vocabulary, sentences, beam_size=2)
    record = load(path)  # nothing else: the vocabulary comes from the file
    model = build_model(record, "fused")
    stored = Vocabulary.from_tensor(record.vocabulary)
    assert translate_sentences(model, stored, sentences, beam_size=2) == expected
    assert translate_sentences(model, Vocabulary.from_tensor(record.vocabulary), sentences) == \
        translate_sentences(trainer.model, vocabulary, sentences)


def test_a_model_file_without_the_vocabulary_field_still_loads(tmp_path):
    """Files written before the field existed have no "vocabulary" key at all."""
    from common.config import TransformerConfig
    from common.weights import export_weights

    config = TransformerConfig(d_model=8, n_heads=2, n_layers=1, d_ff=8, src_vocab_size=5,
                               tgt_vocab_size=5, max_seq_len=8)
    path = save(ModelFile("explicit", config, {}, export_weights(build("explicit", config, seed=0))),
                tmp_path / "new.pt")
    payload = torch.load(path, weights_only=True)
    del payload["vocabulary"]
    payload["digest"] = _digest(payload)
    torch.save(payload, tmp_path / "old.pt")
    assert load(tmp_path / "old.pt").vocabulary is None


@pytest.mark.slow
def test_a_tiny_model_learns_the_sample_and_beam_search_scores_it(sample_corpus, corpus):
    """Train -> beam -> BLEU end to end: the test sentences are new combinations of words the
    train split holds, and 300 steps of a one-layer model translate them all (100 BLEU).

    In float64, so that the verdict does not depend on the CPU: in float32 the 300 steps
    amplify kernel rounding chaotically, and an Intel Xeon's kernels ended at 87 greedy BLEU
    where an AMD EPYC's reached 100. In float64 a last-bit change of the learning rate (1e-7
    relative, far above float64 rounding) still ends at 100 greedy and beam-4 BLEU, and so does
    200 steps instead of 300."""
    settings = TranslationSettings(vocabulary_size=120, d_model=64, n_heads=4, n_layers=1, d_ff=128,
                                   dropout=0.0, max_seq_len=32, batch_tokens=400, pool_size=256,
                                   warmup=30, lr_factor=0.5, steps=300)
    vocabulary = train_vocabulary(training_sentences(corpus), settings.vocabulary_settings())
    data = TranslationData(CorpusSettings(str(sample_corpus.path)), settings.vocabulary_settings(),
                           settings.batch_tokens, settings.pool_size, seed=0)
    model = build("explicit", settings.config(), seed=0).double()
    trainer = Trainer(model, TokenBatches(encode_pairs(vocabulary, corpus.pairs("train")), data),
                      settings.recipe())
    losses = train_translation(trainer, settings)
    assert losses[-1] < losses[0] / 3
    scores = evaluate(model, vocabulary, corpus.test)
    assert scores[1].bleu > 90 and scores[4].bleu > 90, scores
    assert scores[4].chrf > 90
