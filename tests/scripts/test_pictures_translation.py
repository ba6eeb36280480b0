"""What ``python -m scripts.pictures --translation`` draws: each decoder layer's cross-attention
while the model translates, as source-piece x produced-piece weights, worked out here from the
canonical weights and the points a forward pass captures; its labels are the pieces; bad
options and files fail in one line; (slow) the PNGs are drawn."""

from __future__ import annotations

import math

import pytest
import sentencepiece
import torch

from common.masks import decoder_mask, padding_mask
from common.probes import capture
from common.weights import export_weights
from scripts import pictures
from scripts.pictures import cross_attention
from seq2seq.data.corpus import normalize
from seq2seq.data.ids import BOS_ID, EOS_ID
from seq2seq.data.subwords import VocabularySettings, train_vocabulary
from seq2seq.pipeline import TranslationSettings, translate_sentences
from seq2seq.storage.model_file import ModelFile, save
from tests.seq2seq.conftest import sample_pairs
from variants import build

SENTENCE = "The dog likes the garden."
TINY = TranslationSettings(vocabulary_size=120, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                           max_seq_len=20, dropout=0.0)


@pytest.fixture(scope="module")
def vocabulary():
    """Pieces of the sample corpus the translation tests write (both sides, normalised)."""
    sentences = [normalize(text) for pair in sample_pairs() for text in pair]
    return train_vocabulary(sentences, VocabularySettings(120))


def test_the_weights_are_each_layers_cross_attention_over_the_pieces(vocabulary):
    model = build("fused", TINY.config(), seed=3)  # read through a mathfirst copy
    picture = cross_attention(model, vocabulary, SENTENCE, beam_size=1)

    # the labels: sentencepiece's own pieces of the sentence, then EOS
    processor = sentencepiece.SentencePieceProcessor(model_proto=vocabulary.model_proto)
    assert picture.source_pieces == [*processor.encode(SENTENCE, out_type=str), "</s>"]
    assert picture.translation == translate_sentences(model, vocabulary, [SENTENCE], beam_size=1)[0]
    produced = [processor.piece_to_id(piece) for piece in picture.target_pieces]
    assert processor.decode([i for i in produced if i != EOS_ID]) == picture.translation
    assert EOS_ID not in produced[:-1]
    layers, heads, rows, sources = picture.weights.shape
    assert (layers, heads) == (2, 2) and rows == len(produced) and sources == len(picture.source_pieces)

    # the same function by hand: softmax(Q Kᵀ / √Dh) per head from the canonical weights, the
    # query the norm1 output (post-norm: what cross-attention reads), the keys the memory
    src = torch.tensor([[processor.piece_to_id(piece) for piece in picture.source_pieces]])  # (1, S)
    tgt = torch.tensor([[BOS_ID, *produced[:-1]]])  # (1, T): each row's query sits one piece before
    points = capture(model.eval(), (src, tgt, padding_mask(src, 0), decoder_mask(tgt, 0)))
    state = export_weights(model)
    head_dim = TINY.d_model // TINY.n_heads
    for layer in range(layers):
        prefix = f"decoder.layers.{layer}.cross_attn"
        query, memory = points[f"decoder.layers.{layer}.norm1"][0], points["encoder.norm"][0]
        q, k = ((x @ state[f"{prefix}.{w}.weight"].T + state[f"{prefix}.{w}.bias"]).view(-1, heads, head_dim)
                for x, w in ((query, "wq"), (memory, "wk")))  # (T, H, Dh), (S, H, Dh)
        expected = (torch.einsum("thd,shd->hts", q, k) / math.sqrt(head_dim)).softmax(dim=-1)  # (H, T, S)
        torch.testing.assert_close(picture.weights[layer], expected)
    torch.testing.assert_close(picture.weights.sum(dim=-1), torch.ones(layers, heads, rows))


def test_bad_translation_options_fail_in_one_line(tmp_path, vocabulary, capsys):
    config = TINY.config()
    model_file = save(ModelFile("explicit", config, {}, export_weights(build("explicit", config, seed=0)),
                                vocabulary=vocabulary.to_tensor()), tmp_path / "model.pt")
    no_vocabulary = save(ModelFile("explicit", config, {}, export_weights(build("explicit", config, seed=0))),
                         tmp_path / "plain.pt")
    out = str(tmp_path / "out")
    for argv, said in (
        (["--sentences", "Hi."], "--translation MODEL and --sentences TEXT ... go together"),
        (["--translation", str(model_file)], "go together"),
        (["--translation", str(tmp_path / "nowhere.pt"), "--sentences", "Hi."], "nowhere.pt"),
        (["--translation", str(no_vocabulary), "--sentences", "Hi."], "holds no subword vocabulary"),
        (["--translation", str(model_file), "--sentences", "Hi.", "--layer", "2"], "--layer must lie in"),
        (["--translation", str(model_file), "--sentences", "Hi.", "--beam", "0"], "--beam: must be positive"),
        (["--translation", str(model_file), "--sentences", "the cat " * 10], "sentence 1:"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            pictures.main(["--out", out, *argv])
        code = exit_info.value.code
        err = code if isinstance(code, str) else capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "error:" in err and said in err, err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


@pytest.mark.slow  # drawing: the data is checked above
def test_draws_one_picture_per_sentence(tmp_path, vocabulary):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    config = TINY.config()
    model_file = save(ModelFile("explicit", config, {}, export_weights(build("explicit", config, seed=0)),
                                vocabulary=vocabulary.to_tensor()), tmp_path / "model.pt")
    out = tmp_path / "pictures"
    pictures.main(["--translation", str(model_file), "--out", str(out), "--sentences", SENTENCE, "Help!",
                   "--beam", "2", "--layer", "0"])
    for number in (1, 2):
        pixels = imread(out / f"cross_attention_{number}.png")[..., :3]
        assert ((pixels.max(-1) - pixels.min(-1)) > 0.2).mean() > 0.2  # heatmaps drawn
