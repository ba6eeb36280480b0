"""The road back (``seq2seq.hub.to_hf``, ``python -m seq2seq.export_hf``): a model file written
as a MarianMTModel folder that transformers loads with the rows' forward (float64, 1e-9), whose
``generate`` gives the rows' greedy and beam-4 tokens, that converts back to the same model file,
and that CTranslate2's own converter reads and decodes alike; what Marian cannot compute is
refused by field.

The models: a paper-positions model shaped as this project trains one (BOS start, one joint
vocabulary, relu; no final norms, eps 1e-5), whose export permutes the residual coordinates; a
Marian-positions model with two vocabularies, swish and two FFN widths; and the converted tiny
opus-mt checkpoints (``conftest``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from common.config import TransformerConfig
from common.masks import decoder_mask, padding_mask
from seq2seq import export_hf
from seq2seq.data.ids import BOS_ID, EOS_ID
from seq2seq.data.subwords import Vocabulary, VocabularySettings, train_vocabulary
from seq2seq.hub import tiny
from seq2seq.hub.families import FAMILIES
from seq2seq.hub.from_hf import canonical_weights, convert
from seq2seq.hub.to_hf import ctranslate2_problems, export, export_problems, restore_residual
from seq2seq.pipeline import translate_sentences
from seq2seq.search.beam import beam_search
from seq2seq.search.greedy import greedy_decode
from seq2seq.storage.model_file import ModelFile, build_model, save
from tests.helpers import random_canonical

TOLERANCE = 1e-9
MAX_LEN = 12
EXPORTABLE = dict(dropout=0.0, norm_eps=1e-5, final_norm=False, max_seq_len=32)
CONFIGS = {
    "paper-tied": TransformerConfig(d_model=16, n_heads=4, n_layers=2, d_ff=32, src_vocab_size=30,
                                    tgt_vocab_size=30, share_embeddings=True, **EXPORTABLE),
    "marian-two-ffn": TransformerConfig(d_model=12, n_heads=3, n_layers=2, d_ff=24, decoder_d_ff=16,
                                        src_vocab_size=27, tgt_vocab_size=21, positions="marian",
                                        activation="silu", **EXPORTABLE),
}


def made_here(name: str) -> ModelFile:
    """A model file of random weights (every tensor distinct), banning padding (a random model
    would generate it, which the searches here and generate's end differently) and one more id."""
    config = CONFIGS[name]
    return ModelFile("explicit", config, {}, random_canonical(config, seed=2), banned_ids=(config.pad_id, 5))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (record, folder), each exported once."""
    built = {}
    for name in CONFIGS:
        record = made_here(name)
        folder = tmp_path_factory.mktemp(name) / "hf"
        export(record, folder)
        built[name] = (record, folder)
    return built


def hf_float64(folder):
    return tiny.hf_float64(folder)  # Hugging Face's float32 sinusoids recomputed in float64


def batch(config: TransformerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(3, config.src_vocab_size, (4, 7), generator=generator)
    src[1, 5:] = config.pad_id
    src[:, -1] = EOS_ID
    src[1, 4] = EOS_ID
    tgt = torch.randint(3, config.tgt_vocab_size, (4, 6), generator=generator)
    tgt[:, 0] = BOS_ID
    return src, tgt


@pytest.mark.parametrize("name", CONFIGS)
def test_transformers_loads_it_and_computes_the_rows_forward(exported, name, variant):
    record, folder = exported[name]
    config = record.config
    src, tgt = batch(config)
    model = build_model(record, variant).double().eval()
    with torch.no_grad():
        ours = model(src, tgt, padding_mask(src, config.pad_id), decoder_mask(tgt, config.pad_id))
        logits = hf_float64(folder)(input_ids=src, attention_mask=(src != config.pad_id).long(),
                                    decoder_input_ids=tgt).logits
    assert (ours - logits.log_softmax(dim=-1)).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("name", CONFIGS)
def test_generate_gives_the_rows_greedy_and_beam_tokens(exported, name):
    """Its generation config carries the start, EOS and the banned id: generate needs no more.
    Beam 4 at Hugging Face's length_penalty 0 and alpha 0 (both rank by log-probability)."""
    record, folder = exported[name]
    config = record.config
    src, _ = batch(config)
    hf = hf_float64(folder)
    mask = (src != config.pad_id).long()
    model = build_model(record, "explicit").double().eval()
    arguments = dict(bos_id=BOS_ID, eos_id=EOS_ID, max_len=MAX_LEN, banned_ids=record.banned_ids)
    greedy = greedy_decode(model, src, padding_mask(src, config.pad_id), **arguments)
    expected = hf.generate(input_ids=src, attention_mask=mask, num_beams=1, do_sample=False,
                           max_length=MAX_LEN)
    assert torch.equal(greedy, expected)
    beam = beam_search(model, src, padding_mask(src, config.pad_id), beam_size=4, alpha=0.0, **arguments)
    expected = hf.generate(input_ids=src, attention_mask=mask, num_beams=4, do_sample=False,
                           max_length=MAX_LEN, length_penalty=0.0)
    assert [until_eos(row) for row in beam.tokens.tolist()] == [until_eos(row) for row in expected.tolist()]


def until_eos(row: list[int]) -> list[int]:
    """A hypothesis's ids up to and with its first EOS (what fills a row after it differs:
    padding here, EOS in generate's beam output)."""
    return row[: row.index(EOS_ID) + 1] if EOS_ID in row else row


@pytest.mark.parametrize("name", CONFIGS)
def test_its_tensors_map_back_to_the_model_file_exactly(exported, name):
    """Hugging Face's tensors read through the converter's map, the permutation undone: every
    canonical tensor equal to the original's."""
    record, folder = exported[name]
    config = record.config
    hf = tiny.hf_library().MarianMTModel.from_pretrained(folder)
    tensors = {**dict(hf.named_parameters(remove_duplicate=False)), **dict(hf.named_buffers())}
    read = canonical_weights(tensors, FAMILIES["MarianMTModel"], config.replace(positions="marian"))
    back = restore_residual(read, config)
    assert set(back) == set(record.weights)
    assert all(torch.equal(back[key], record.weights[key]) for key in record.weights)
    if config.positions == "paper":  # the permutation is not the identity: unrestored, tensors differ
        assert not torch.equal(read["src_embed.weight"], record.weights["src_embed.weight"])


def test_a_converted_opus_mt_model_goes_back_and_converts_to_the_same_file(checkpoint, tmp_path):
    if checkpoint.family != "marian":
        pytest.skip("a fairseq model's positions are refused (test_refused_by_field)")
    record = checkpoint.record
    export(record, tmp_path / "hf")
    again = convert(tmp_path / "hf")
    assert again.config == record.config
    assert again.banned_ids == record.banned_ids
    assert set(again.weights) == set(record.weights)
    assert all(torch.equal(again.weights[key], record.weights[key]) for key in record.weights)
    for key, value in record.tokenizer.items():
        theirs = again.tokenizer[key]
        assert torch.equal(theirs, value) if isinstance(value, torch.Tensor) else theirs == value


@pytest.mark.parametrize("changes, said", [
    (dict(final_norm=True), "final_norm=True: MarianMTModel has no LayerNorm after either stack"),
    (dict(norm_first=True), "norm_first=True: MarianMTModel's layers are post-norm"),
    (dict(norm_eps=1e-6), "norm_eps=1e-06: MarianMTModel's LayerNorm eps is 1e-05"),
    (dict(positions="fairseq"), "positions='fairseq'"),
])
def test_refused_by_field(changes, said, tmp_path):
    config = CONFIGS["paper-tied"].replace(**changes)
    assert [problem for problem in export_problems(config) if problem.startswith(said)]
    record = ModelFile("explicit", config, {}, random_canonical(config))
    with pytest.raises(ValueError, match="MarianMTModel cannot compute this model"):
        export(record, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_every_field_that_cannot_go_is_named_at_once():
    config = CONFIGS["paper-tied"].replace(final_norm=True, norm_eps=1e-6)
    assert len(export_problems(config)) == 2
    assert export_problems(CONFIGS["paper-tied"]) == export_problems(CONFIGS["marian-two-ffn"]) == []


def test_ctranslate2_s_converter_reads_it_and_decodes_the_rows_tokens(tiny_named, tmp_path):
    """CTranslate2's converter reads the folder (it needs the tokenizer's vocabulary: a converted
    opus-mt model carries Marian's) and its greedy tokens are the rows' (float32 both). Its Marian
    loader starts the decoder from a zero vector, not the start id's embedding, and drops the
    trailing <pad> from the vocabulary: real opus-mt checkpoints hold zeros in that row, so the
    tiny one's is zeroed here as theirs is."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    record = tiny_named("marian-swish-tied").record
    pad = record.config.pad_id
    assert [problem.split(",")[0] for problem in ctranslate2_problems(record)] == [
        "it starts the decoder from a zero vector"]  # the tiny model's padding row is random
    weights = dict(record.weights)
    embedding = weights["src_embed.weight"].clone()
    embedding[pad] = 0
    weights.update(dict.fromkeys(("src_embed.weight", "tgt_embed.weight", "generator.weight"), embedding))
    record = ModelFile(record.variant, record.config, record.settings, weights, tokenizer=record.tokenizer,
                       banned_ids=record.banned_ids)
    assert ctranslate2_problems(record) == []
    export(record, tmp_path / "hf")
    ctranslate2.converters.TransformersConverter(str(tmp_path / "hf")).convert(str(tmp_path / "ct2"))
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    hf_tokenizer = tiny.hf_library().MarianTokenizer.from_pretrained(tmp_path / "hf")
    ids = [hf_tokenizer(text)["input_ids"] for text in tiny.SENTENCES]
    results = translator.translate_batch([hf_tokenizer.convert_ids_to_tokens(row) for row in ids],
                                         beam_size=1, max_decoding_length=MAX_LEN - 1,
                                         min_decoding_length=0)  # its default 1 forbids EOS first
    theirs = [hf_tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results]
    model = build_model(record, "explicit").eval()
    ours = []
    for row in ids:
        src = torch.tensor([row])
        tokens = greedy_decode(model, src, padding_mask(src, pad), max_len=MAX_LEN, bos_id=pad, eos_id=0,
                               banned_ids=record.banned_ids)[0].tolist()[1:]
        ours.append([i for i in tokens if i not in (0, pad)])  # CTranslate2 leaves EOS out
    assert ours == theirs
    assert len({len(row) for row in ours}) > 1  # some end early, some run to the limit


def test_a_model_trained_here_is_one_ctranslate2_s_converter_refuses_and_the_command_says_why(
        trained_here, tmp_path, capsys):
    """CTranslate2's Marian loader drops the embeddings' last row (Marian's trailing <pad>) and
    starts the decoder from a zero vector: it refuses the folder of a model trained here, whose
    last piece is a word piece and whose decoder starts from BOS's learnt row, and the command
    says both in one warning line (the folder is written: transformers decodes it)."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    record, vocabulary, folder = trained_here
    with pytest.raises(ValueError):
        ctranslate2.converters.TransformersConverter(str(folder)).convert(str(tmp_path / "ct2"))
    capsys.readouterr()
    tiny.hf_library().utils.logging.enable_progress_bar()  # the command turns them off itself
    export_hf.main([str(save(record, tmp_path / "model.pt")), "--output", str(tmp_path / "hf")])
    out, err = capsys.readouterr()
    assert out.startswith(f"wrote {tmp_path / 'hf'}: MarianMTModel")
    last = vocabulary.pieces([vocabulary.size - 1])[0]
    assert last != "<pad>" and record.weights["tgt_embed.weight"][BOS_ID].abs().sum() > 0
    assert err.count("\n") == 1 and err.startswith("python -m seq2seq.export_hf: warning: CTranslate2")
    assert f"not from the start id's ({BOS_ID}) embedding row" in err
    assert f"the last piece here is {last!r}" in err


def test_the_command_writes_the_folder(tmp_path, capsys):
    path = save(made_here("paper-tied"), tmp_path / "model.pt")
    export_hf.main([str(path), "--output", str(tmp_path / "hf")])
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'hf'}: MarianMTModel")
    assert {"config.json", "model.safetensors", "generation_config.json"} <= {
        file.name for file in (tmp_path / "hf").iterdir()}


@pytest.mark.parametrize("output", ["model.pt", "model.pt/hf", "."])
def test_the_command_never_writes_onto_or_around_its_input(tmp_path, capsys, output):
    path = save(made_here("paper-tied"), tmp_path / "model.pt")
    before = path.read_bytes()
    with pytest.raises(SystemExit) as exit_info:
        export_hf.main([str(path), "--output", str(tmp_path / output)])
    assert exit_info.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert path.read_bytes() == before


@pytest.mark.parametrize("damage", [b"", b"not a model file", None])
def test_a_damaged_or_refused_model_file_is_one_line_and_exit_1(tmp_path, capsys, damage):
    path = tmp_path / "model.pt"
    if damage is None:  # a readable file whose config Marian cannot compute
        config = CONFIGS["paper-tied"].replace(final_norm=True)
        save(ModelFile("explicit", config, {}, random_canonical(config)), path)
    else:
        path.write_bytes(damage)
    with pytest.raises(SystemExit) as exit_info:
        export_hf.main([str(path), "--output", str(tmp_path / "hf")])
    message = str(exit_info.value.code)
    assert message.startswith("python -m seq2seq.export_hf: error:") and "\n" not in message
    assert str(path) in message or "final_norm=True" in message
    assert not (tmp_path / "hf").exists()


def test_a_model_trained_here_takes_the_road(tmp_path, capsys):
    """python -m seq2seq.train --no-final-norm --norm-eps 1e-5 trains a model the export takes
    (here a few steps of a synthetic task), and transformers computes its forward; the
    translation preset's defaults (final norms, eps 1e-6) are refused by those two fields."""
    from common.cli import Parser
    from seq2seq import train
    from seq2seq.options import add_options, settings_from_options
    from seq2seq.storage.model_file import load

    train.main(["--task", "copy", "--steps", "2", "--d-model", "16", "--heads", "2", "--d-ff", "32",
                "--layers", "1", "--no-final-norm", "--norm-eps", "1e-5",
                "--checkpoint-dir", str(tmp_path / "run")])
    checkpoint = sorted((tmp_path / "run").glob("step-*.pt"))[-1]
    export_hf.main([str(checkpoint), "--output", str(tmp_path / "hf")])
    record = load(checkpoint)
    config = record.config
    src, tgt = batch(config)
    model = build_model(record, "explicit").double().eval()
    with torch.no_grad():
        ours = model(src, tgt, padding_mask(src, config.pad_id), decoder_mask(tgt, config.pad_id))
        logits = hf_float64(tmp_path / "hf")(input_ids=src, attention_mask=(src != config.pad_id).long(),
                                             decoder_input_ids=tgt).logits
    assert (ours - logits.log_softmax(dim=-1)).abs().max().item() <= TOLERANCE
    parser = Parser(prog="python -m seq2seq.train")
    add_options(parser)
    (tmp_path / "fra.txt").write_text("Hi.\tSalut.\tCC-BY\n", encoding="utf-8")
    options = parser.parse_args(["--task", "translate", "--data", str(tmp_path / "fra.txt")])
    preset = settings_from_options(options)
    assert [problem.split("=")[0] for problem in export_problems(preset.config)] == ["final_norm", "norm_eps"]


@pytest.fixture(scope="module")
def trained_here(tmp_path_factory) -> tuple[ModelFile, Vocabulary, Path]:
    """A model file as this project's translation runs write one for export (paper positions,
    BOS start, one joint sentencepiece vocabulary, tied, dropout 0.1; no final norms, eps 1e-5),
    its vocabulary, and its folder, exported once."""
    vocabulary = train_vocabulary(iter((tiny.SOURCE_SENTENCES + tiny.TARGET_SENTENCES) * 3),
                                  VocabularySettings(60, "bpe"))
    config = CONFIGS["paper-tied"].replace(src_vocab_size=vocabulary.source_size,
                                           tgt_vocab_size=vocabulary.target_size, dropout=0.1)
    weights = random_canonical(config, seed=3)
    record = ModelFile("explicit", config, {}, weights, vocabulary=vocabulary.to_tensor())
    folder = tmp_path_factory.mktemp("trained-here") / "hf"
    export(record, folder)
    return record, vocabulary, folder


def test_a_model_trained_here_converts_back_to_the_same_model_file(trained_here):
    """Out and back: the same config but for Marian's positions (the permutation), every tensor
    equal once the permutation is undone, the same vocabulary (so the same ids), BOS still the
    decoder's start; and translate's text from the file that came back is the original's."""
    record, vocabulary, folder = trained_here
    again = convert(folder)
    assert again.config == record.config.replace(positions="marian")
    assert (again.config.decoder_start, again.tokenizer, again.banned_ids) == ("bos", None, ())
    back = restore_residual(again.weights, record.config)
    assert set(back) == set(record.weights)
    assert all(torch.equal(back[key], record.weights[key]) for key in record.weights)
    assert not torch.equal(again.weights["src_embed.weight"], record.weights["src_embed.weight"])
    assert again.weights["generator.weight"] is again.weights["src_embed.weight"]  # tied again
    assert torch.equal(again.vocabulary, record.vocabulary)
    texts = ["The cat sees the house.", "Wo ist der Bahnhof?", "Zebras quote xylophones!"]
    assert Vocabulary.from_tensor(again.vocabulary).encode(texts) == vocabulary.encode(texts)
    models = [build_model(file, "explicit").double() for file in (record, again)]
    translations = [translate_sentences(model, vocabulary, texts) for model in models]
    assert translations[0] == translations[1]
    assert len(set(translations[0])) > 1


def test_a_model_trained_here_gets_a_marian_tokenizer_of_its_own_vocabulary(trained_here):
    """The joint sentencepiece vocabulary goes as Marian's tokenizer: transformers' MarianTokenizer
    gives the project's ids (EOS appended, as a source is written here) and decodes its text."""
    record, vocabulary, folder = trained_here
    config = record.config
    tokenizer = tiny.hf_library().MarianTokenizer.from_pretrained(folder)
    texts = ["The cat sees the house.", "Wo ist der Bahnhof?"]
    assert tokenizer(texts)["input_ids"] == [[*ids, EOS_ID] for ids in vocabulary.encode(texts)]
    rows = [[BOS_ID, *ids, EOS_ID, config.pad_id] for ids in vocabulary.encode(texts)]
    assert tokenizer.batch_decode(rows, skip_special_tokens=True) == texts
