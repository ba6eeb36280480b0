"""Bad input to the translation library is refused in one line before any work, and the behaviours
the headline numbers rest on (multi-reference BLEU, translations in input order, user input
normalised as the corpus was) hold, each checked against an independent computation. What the
training command refuses of a translation run (nothing overwritten without asking) is in
commands/test_train.py."""

from __future__ import annotations

import io
import re
import sys
import unicodedata
import zipfile

import pytest
import torch
from sacrebleu.metrics import BLEU, CHRF
from torch import Tensor, nn

from common.config import TransformerConfig
from common.masks import padding_mask
from common.weights import export_weights
from seq2seq import average, pipeline, translate
from seq2seq.data.batches import EncodedPairs, within
from seq2seq.data.corpus import CorpusSettings, Example, load_corpus, read_pairs
from seq2seq.data.ids import BOS_ID, EOS_ID, PAD_ID
from seq2seq.data.subwords import VocabularySettings, train_vocabulary
from seq2seq.evaluation import corpus_scores
from seq2seq.pipeline import TranslationModel, training_sentences
from seq2seq.search.beam import beam_search
from seq2seq.search.greedy import greedy_decode
from seq2seq.storage.model_file import ModelFile, load, save
from seq2seq.training.averaging import average_files
from seq2seq.training.recipe import StepReport
from seq2seq.training.run import checkpoint_path, progress_bar
from variants import build

# --- the corpus file --------------------------------------------------------------------------


def test_lone_cr_line_ends_split_lines_as_universal_newlines_do(tmp_path):
    path = tmp_path / "mac.txt"
    path.write_bytes(b"Go.\tVa !\rHi.\tSalut.\r\nRun!\tCours !\n")
    assert read_pairs(path) == [("Go.", "Va !"), ("Hi.", "Salut."), ("Run!", "Cours !")]


def test_a_nul_byte_and_a_truncated_zip_are_named(tmp_path):
    path = tmp_path / "nul.txt"
    path.write_bytes(b"Go.\tVa !\nHi.\tSa\x00lut.\n")
    with pytest.raises(ValueError, match=r"nul\.txt, line 2: holds a NUL byte \(column 7\)"):
        read_pairs(path)
    whole = tmp_path / "whole.zip"
    with zipfile.ZipFile(whole, "w") as zipped:
        zipped.writestr("fra.txt", "Go.\tVa !\n" * 200)
    cut = tmp_path / "cut.zip"
    cut.write_bytes(whole.read_bytes()[:100])  # a download that stopped early
    with pytest.raises(ValueError, match=r"cut\.zip: a damaged zip \(truncated"):
        read_pairs(cut)


def test_a_nul_byte_in_a_lines_first_column_is_named(tmp_path):
    path = tmp_path / "nul.txt"
    path.write_bytes(b"Go.\tVa !\n\x00Hi.\tSalut.\n")
    with pytest.raises(ValueError, match=r"nul\.txt, line 2: holds a NUL byte \(column 1\)"):
        read_pairs(path)
    path.write_bytes(b"\x00Go.\tVa !\n")
    with pytest.raises(ValueError, match=r"nul\.txt, line 1: holds a NUL byte \(column 1\)"):
        read_pairs(path)


@pytest.mark.parametrize(("encoding", "named"), [
    ("utf-16", "UTF-16"), ("utf-16-le", "UTF-16"), ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32"),
])
def test_a_utf16_or_utf32_export_is_named_by_its_encoding(tmp_path, encoding, named):
    """Python's "utf-16" and "utf-32" write a byte-order mark, "-le" and "-be" none."""
    path = tmp_path / "fra.txt"
    path.write_text("Go.\tVa !\nHi.\tSalut.\n", encoding=encoding)
    with pytest.raises(ValueError, match=rf"fra\.txt: looks like {named}; convert it to UTF-8"):
        read_pairs(path)
    zipped = tmp_path / "fra-eng.zip"
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.write(path, "fra.txt")
    with pytest.raises(ValueError, match=rf"fra-eng\.zip:fra\.txt: looks like {named}; convert it to UTF-8"):
        read_pairs(zipped)


def test_references_equal_after_normalisation_are_kept_once(tmp_path):
    lines = ["Thanks!\tMerci\u202f!", "Thanks!\tMerci\u00a0!", "Thanks!\tMerci !", "Thanks!\tMerci bien !"]
    lines += [f"Go {n}.\tVa {n} !" for n in range(300)]  # enough sentences for three splits
    path = tmp_path / "fra.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    corpus = load_corpus(CorpusSettings(str(path)))
    [thanks] = [e for split in (corpus.train, corpus.valid, corpus.test) for e in split
                if e.source == "Thanks!"]
    assert thanks.references == ("Merci !", "Merci bien !")
    nfc = load_corpus(CorpusSettings(str(path), normalization="NFC"))  # NFC keeps U+202F apart
    [thanks] = [e for split in (nfc.train, nfc.valid, nfc.test) for e in split
                if e.source == "Thanks!"]
    assert thanks.references == ("Merci\u202f!", "Merci\u00a0!", "Merci !", "Merci bien !")


# --- scores -----------------------------------------------------------------------------------


def test_bleu_reads_every_reference_not_only_the_first():
    """A hypothesis equal to a segment's second or third reference is a perfect match: BLEU 100,
    whatever the first reference says."""
    hypotheses = ["the old man walks to the big house", "a small bird sings in the green tree"]
    references = [["nothing in common here at all friend", "the old man walks to the big house"],
                  ["words that share nothing", "more unrelated words there",
                   "a small bird sings in the green tree"]]
    assert corpus_scores(hypotheses, references).bleu == pytest.approx(100.0)
    only_first = corpus_scores(hypotheses, [refs[:1] for refs in references]).bleu
    assert only_first < 10.0


def test_evaluate_reads_every_reference_not_only_the_first(echo):
    """Through ``evaluate``: each source's second reference is (nearly) its translation, the
    first shares nothing with it; the expected scores are sacreBLEU's own on the strings."""
    model, vocabulary = echo
    sources = ["the cat sees the house.", "my father likes a song.", "our teacher follows the dog."]
    hypotheses = [normal(s) for s in sources]  # the echo model's translations
    first = ["nothing in common", "words unrelated here", "quite another line"]
    second = [hypotheses[0], "my father likes a book.", hypotheses[2]]
    examples = [Example(source, (one, two)) for source, one, two in zip(sources, first, second, strict=True)]
    expected_bleu = BLEU().corpus_score(hypotheses, [first, second]).score
    expected_chrf = CHRF().corpus_score(hypotheses, [first, second]).score
    only_first = BLEU().corpus_score(hypotheses, [first]).score
    assert only_first < 10.0 < expected_bleu < 100.0  # the case tells the two apart
    scores = pipeline.evaluate(model, vocabulary, examples, beam_sizes=(1, 2))
    for size in (1, 2):
        assert scores[size].bleu == pytest.approx(expected_bleu, abs=1e-9)
        assert scores[size].chrf == pytest.approx(expected_chrf, abs=1e-9)


# --- translating ------------------------------------------------------------------------------


class EchoModel(nn.Module):
    """encode/decode/project whose greedy (and beam) decoding of a source ``p1 .. pn EOS`` is
    ``BOS p1 .. pn EOS``: the output is the input's pieces, so a translation is the normalised
    input, computed without the model."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.config = TransformerConfig(d_model=vocab, n_heads=1, n_layers=1, d_ff=4, dropout=0.0,
                                        src_vocab_size=vocab, tgt_vocab_size=vocab, max_seq_len=64,
                                        pad_id=PAD_ID)
        self.unused = nn.Parameter(torch.zeros(1))
        self.encoded_rows = 0  # sources the model was asked to encode

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        self.encoded_rows += src.shape[0]
        return nn.functional.one_hot(src, self.vocab).float()  # (B, S, V)

    def decode(self, tgt: Tensor, memory: Tensor, src_mask=None, tgt_mask=None) -> Tensor:
        steps = min(tgt.shape[1], memory.shape[1])
        hidden = torch.zeros(tgt.shape[0], tgt.shape[1], self.vocab)
        hidden[:, :steps] = memory[:, :steps]
        hidden[:, steps:, EOS_ID] = 1.0
        return hidden  # after position i, the source's piece i

    def project(self, hidden: Tensor) -> Tensor:
        return (10.0 * hidden).log_softmax(dim=-1)


@pytest.fixture(scope="module")
def echo(sample_corpus):
    corpus = load_corpus(CorpusSettings(str(sample_corpus.path)))
    vocabulary = train_vocabulary(training_sentences(corpus), VocabularySettings(120))
    return EchoModel(vocabulary.size), vocabulary


def normal(text: str) -> str:
    return re.sub(" +", " ", unicodedata.normalize("NFKC", text)).strip(" ")


SENTENCES = ["the cat sees the house.", "Run!", "my father likes a song and the dog hears the sea.",
             "a bird.", "our teacher follows my brother to the garden.", "Help!"]


@pytest.mark.parametrize("beam_size", [1, 3])
def test_translations_come_back_in_input_order(echo, beam_size):
    model, vocabulary = echo
    out = pipeline.translate_sentences(model, vocabulary, SENTENCES, beam_size=beam_size, batch_size=2)
    assert out == SENTENCES  # sorted by length inside, returned in the order given


def test_user_input_is_normalised_as_the_corpus_was(echo):
    model, vocabulary = echo
    sentences = ["  Cours\u202f!", "Au   secours\u00a0!", "mon pe\u0300re voit la mer."]
    out = pipeline.translate_sentences(model, vocabulary, sentences)
    assert out == [normal(s) for s in sentences] == ["Cours !", "Au secours !", "mon père voit la mer."]


def test_a_blank_sentence_gives_a_blank_line_in_its_place(echo, monkeypatch, capsys):
    model, vocabulary = echo
    before = model.encoded_rows
    out = pipeline.translate_sentences(model, vocabulary, ["Run!", "", "  ", "a bird."])
    assert out == ["Run!", "", "", "a bird."]
    assert model.encoded_rows - before == 2  # the blank ones never reach the model
    record = ModelFile("explicit", model.config, {}, {}, vocabulary=vocabulary.to_tensor())  # nothing banned
    monkeypatch.setattr(translate, "load_translation_model",
                        lambda path, variant: TranslationModel(record, vocabulary, model, "NFKC"))
    monkeypatch.setattr("sys.stdin", io.StringIO("Run!\n\nthe cat sees the house.\n"))
    translate.main(["model.pt", "--beam", "1"])
    assert capsys.readouterr().out == "Run!\n\nthe cat sees the house.\n"


@pytest.mark.parametrize("batch_size", [0, -1])
def test_a_batch_size_below_one_is_refused(echo, batch_size):
    model, vocabulary = echo
    with pytest.raises(ValueError, match=rf"batch_size must be at least 1, got {batch_size}"):
        pipeline.translate_sentences(model, vocabulary, ["Run!", "Help!"], batch_size=batch_size)


def test_validation_loss_of_no_pairs_and_decoding_an_unknown_id_are_refused(echo):
    model, vocabulary = echo
    with pytest.raises(ValueError, match="no pairs"):
        pipeline.validation_loss(model, EncodedPairs([], []))
    size = vocabulary.size
    with pytest.raises(ValueError, match=rf"row 1 holds id {size}, outside .*\[0, {size}\)"):
        vocabulary.decode([[5, 6], [5, vocabulary.size]])
    with pytest.raises(ValueError, match=r"row 0 holds id -1"):
        vocabulary.decode([[-1]])


def test_the_pieces_of_an_id_outside_the_vocabulary_are_refused(echo):
    _, vocabulary = echo
    size = vocabulary.size
    assert vocabulary.pieces([0, 1, 2, 3]) == ["<pad>", "<s>", "</s>", "<unk>"]
    for bad in (size, 100_000, -1):
        with pytest.raises(ValueError, match=rf"pieces: id {bad} is outside the vocabulary's \[0, {size}\)"):
            vocabulary.pieces([5, bad])
    with pytest.raises(TypeError, match=r"pieces: id must be an int, got str 'x'"):
        vocabulary.pieces(["x"])


def test_pairs_longer_than_the_model_are_left_out():
    pairs = EncodedPairs([torch.arange(3), torch.arange(5), torch.arange(4)],
                         [torch.arange(4), torch.arange(2), torch.arange(6)])
    kept, dropped = within(pairs, 4)  # pair 1's source and pair 2's target are too long
    assert dropped == 2 and [len(s) for s in kept.sources] == [3] and [len(t) for t in kept.targets] == [4]


# --- decoding a padding-only source ------------------------------------------------------------


@pytest.mark.parametrize("variant", ["torch", "explicit"])
def test_a_padding_only_source_row_is_refused_before_decoding(copy_model, variant):
    model = copy_model.build(variant)
    src = copy_model.src[:3].clone()
    src[1] = PAD_ID  # row 1: nothing but padding
    mask = padding_mask(src, PAD_ID)
    with pytest.raises(ValueError, match="every position of source row 1"):
        greedy_decode(model, src, mask, max_len=6, bos_id=BOS_ID, eos_id=EOS_ID)
    with pytest.raises(ValueError, match="every position of source row 1"):
        beam_search(model, src, mask, bos_id=BOS_ID, eos_id=EOS_ID, beam_size=2)
    kept = greedy_decode(model, src[[0, 2]], mask[[0, 2]], max_len=6, bos_id=BOS_ID, eos_id=EOS_ID)
    assert kept.shape[0] == 2  # the other rows decode


# --- the progress bar -------------------------------------------------------------------------


def test_the_bar_shows_training_time_against_the_budget_and_wall_time_apart(capsys):
    with progress_bar(100, minutes=30.0, file=sys.stderr) as show:
        show(StepReport(step=1, steps=100, loss=2.0, lr=1e-3, tokens=100, seconds=754.0))
    err = capsys.readouterr().err
    assert "training 12:34 of 30 min" in err and "wall 00:0" in err, err


# --- averaging ----------------------------------------------------------------------------------


def test_averaging_refuses_models_of_different_vocabularies(echo, sample_corpus, tmp_path, capsys):
    _, bpe = echo
    corpus = load_corpus(CorpusSettings(str(sample_corpus.path)))
    other_vocabulary = train_vocabulary([*training_sentences(corpus), *["zebra quokka xylophone"] * 50],
                               VocabularySettings(120))  # another corpus: other pieces, the same size
    assert other_vocabulary.size == bpe.size and other_vocabulary.model_proto != bpe.model_proto
    config = TransformerConfig(d_model=8, n_heads=2, n_layers=1, d_ff=8, src_vocab_size=120,
                               tgt_vocab_size=120, max_seq_len=16)

    def model_file(name, vocabulary, seed):
        weights = export_weights(build("explicit", config, seed=seed))
        stored = None if vocabulary is None else vocabulary.to_tensor()
        return save(ModelFile("explicit", config, {}, weights, vocabulary=stored), tmp_path / name)

    first, second = model_file("a.pt", bpe, 0), model_file("b.pt", bpe, 1)
    other, plain = model_file("c.pt", other_vocabulary, 2), model_file("d.pt", None, 3)
    for paths in ([first, other], [other, second], [plain, first], [first, plain]):
        with pytest.raises(ValueError, match="has another subword vocabulary than"):
            average_files(paths)
    same = average_files([first, second])
    assert torch.equal(same.vocabulary, bpe.to_tensor())
    name = "generator.weight"
    expected = (load(first).weights[name].double() + load(second).weights[name].double()) / 2
    torch.testing.assert_close(same.weights[name], expected.float(), rtol=0, atol=1e-7)
    directory = tmp_path / "run"
    directory.mkdir()
    for step, path in ((1, first), (2, other)):
        checkpoint_path(directory, step).write_bytes(path.read_bytes())
    with pytest.raises(SystemExit) as stop:
        average.main(["--checkpoint-dir", str(directory), "--last", "2",
                      "--output", str(tmp_path / "avg.pt")])
    said = stop.value.code if isinstance(stop.value.code, str) else capsys.readouterr().err
    assert "another subword vocabulary" in said and "\n" not in said.strip()
    assert not (tmp_path / "avg.pt").exists()
