"""The converter: the command, what it reads off a checkpoint, and what it refuses in one line."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from seq2seq import convert as command
from seq2seq import translate
from seq2seq.hub import tiny
from seq2seq.hub.families import FAMILIES
from seq2seq.hub.from_hf import (
    canonical_weights,
    convert,
    convert_loaded,
    load_hf_model,
    marian_model,
)
from seq2seq.hub.tokenizers import tokenizer_from_record
from seq2seq.search.greedy import greedy_decode
from seq2seq.storage.model_file import build_model, load, save

# what each tiny checkpoint's config reads as (seq2seq/hub/tiny.py builds them)
EXPECTED = {
    "marian-swish-tied": dict(activation="silu", positions="marian", decoder_start="pad",
                              share_embeddings=True, final_norm=False, decoder_d_ff=None, norm_eps=1e-5),
    "marian-relu-two": dict(activation="relu", positions="marian", decoder_start="pad",
                            share_embeddings=False, pad_id=2),
    "fsmt-tied": dict(activation="relu", positions="fairseq", decoder_start="eos", share_embeddings=True,
                      pad_id=1),
    "fsmt-untied": dict(activation="relu", positions="fairseq", decoder_start="eos", share_embeddings=False,
                        d_ff=48, decoder_d_ff=32, pad_id=1),
}


def test_the_config_is_read_off_the_checkpoint(checkpoint):
    config = checkpoint.record.config
    assert {field: getattr(config, field) for field in EXPECTED[checkpoint.name]} == EXPECTED[checkpoint.name]
    hf = tiny.hf_library().AutoConfig.from_pretrained(checkpoint.folder)
    sizes = ((hf.vocab_size, hf.decoder_vocab_size) if checkpoint.family == "marian"
             else (hf.src_vocab_size, hf.tgt_vocab_size))
    assert (config.src_vocab_size, config.tgt_vocab_size) == sizes
    assert (config.d_model, config.n_heads, config.n_layers, config.max_seq_len) == (16, 4, 2, 64)


def test_marian_s_padding_id_is_banned_as_a_decoding_setting(tiny_named):
    """opus-mt's generation settings forbid the padding id (its decoder's start): the model file's
    banned_ids say so, and the bias stays the checkpoint's; fairseq's forbid nothing, and its
    generator has no bias (zeros)."""
    marian, fsmt = tiny_named("marian-swish-tied"), tiny_named("fsmt-untied")
    pad = marian.record.config.pad_id
    bias = marian.record.weights["generator.bias"]
    hf = tiny.hf_library().MarianMTModel.from_pretrained(marian.folder)
    assert marian.record.settings["hub"]["banned_ids"] == [pad]
    assert marian.record.banned_ids == (pad,)
    assert torch.equal(bias, hf.final_logits_bias[0])
    assert fsmt.record.settings["hub"]["banned_ids"] == []
    assert fsmt.record.banned_ids == ()
    assert torch.equal(fsmt.record.weights["generator.bias"], torch.zeros(fsmt.record.config.tgt_vocab_size))


def test_tied_weights_are_one_tensor_in_the_model_file(tiny_named):
    weights = tiny_named("fsmt-tied").record.weights
    assert weights["src_embed.weight"] is weights["tgt_embed.weight"] is weights["generator.weight"]
    untied = tiny_named("marian-relu-two").record.weights
    assert untied["src_embed.weight"].shape != untied["tgt_embed.weight"].shape


def test_the_command_writes_a_model_file_that_translates(tiny_named, tmp_path, capsys):
    folder = tiny_named("marian-swish-tied").folder
    output = tmp_path / "out" / "model.pt"
    command.main([str(folder), "--output", str(output), "--variant", "mathfirst"])
    said = capsys.readouterr().out
    assert said.startswith(f"wrote {output}: MarianMTModel, d_model 16, 4 heads, 2+2 layers, FFN 32 silu")
    assert said.count("\n") == 1
    record = load(output)
    assert record.variant == "mathfirst" and record.tokenizer["kind"] == "marian"
    translate.main([str(output), "The cat sees the house.", "--beam", "1"])
    assert len(capsys.readouterr().out.splitlines()) == 1


def one_line_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        command.main(argv)
    message = exit_info.value.code if isinstance(exit_info.value.code, str) else capsys.readouterr().err
    assert message.count("\n") <= 1, message
    return message


def test_a_missing_folder_is_one_line(tmp_path, capsys):
    message = one_line_error(capsys, [str(tmp_path / "none"), "--output", str(tmp_path / "m.pt")])
    assert "no such folder" in message and message.startswith("python -m seq2seq.convert: error:")


def test_another_architecture_is_refused_by_name(tmp_path, capsys):
    folder = tmp_path / "bert"
    tiny.hf_library().BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32).save_pretrained(folder)
    message = one_line_error(capsys, [str(folder), "--output", str(tmp_path / "m.pt")])
    assert "is a 'bert' model; the converter reads marian (MarianMTModel) and fsmt" in message


def test_without_transformers_the_extra_is_named(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    (tmp_path / "model").mkdir()
    message = one_line_error(capsys, [str(tmp_path / "model"), "--output", str(tmp_path / "m.pt")])
    assert 'needs transformers: pip install -e ".[hf]"' in message


@pytest.mark.parametrize(("change", "said"), [
    (dict(decoder_layers=1), "encoder_layers (2) differs from decoder_layers (1)"),
    (dict(decoder_attention_heads=2), "encoder_attention_heads (4) differs from decoder_attention_heads (2)"),
    (dict(activation_function="gelu_new"),
     "activation_function 'gelu_new' is none of relu, swish, silu, gelu"),
    (dict(scale_embedding=False), "scale_embedding is False"),
    (dict(decoder_start_token_id=7), "decoder_start_token_id (7) is neither pad_token_id (85) nor "
                                     "eos_token_id (0) nor this project's BOS id (1)"),
])
def test_what_a_config_cannot_express_is_named(tiny_named, change, said):
    model, _, family = load_hf_model(tiny_named("marian-swish-tied").folder)
    for key, value in change.items():
        setattr(model.config, key, value)
    with pytest.raises(ValueError, match="cannot be expressed as a TransformerConfig") as error:
        family.read_config(model.config)
    assert said in str(error.value)


@pytest.mark.parametrize(("start", "expected"), [(85, "pad"), (0, "eos"), (1, "bos")])
def test_a_marian_decoder_start_is_read_by_value(tiny_named, start, expected):
    """opus-mt's padding (85 here), EOS (0), or this project's BOS (1): the first it equals."""
    model, _, family = load_hf_model(tiny_named("marian-swish-tied").folder)
    assert (model.config.pad_token_id, model.config.eos_token_id) == (85, 0)
    model.config.decoder_start_token_id = start
    assert family.read_config(model.config).decoder_start == expected
    model.config.eos_token_id = 1  # EOS first: an id that is both is EOS
    model.config.decoder_start_token_id = 1
    assert family.read_config(model.config).decoder_start == "eos"


def test_an_fsmt_decoder_starts_with_eos_only(tiny_named):
    model, _, family = load_hf_model(tiny_named("fsmt-tied").folder)
    model.config.decoder_start_token_id = model.config.pad_token_id
    with pytest.raises(ValueError, match=r"decoder_start_token_id \(1\) is neither eos_token_id \(2\): "
                                         r"TransformerConfig.decoder_start is 'eos' for a fairseq"):
        family.read_config(model.config)


def test_a_marian_model_that_starts_with_eos_converts_and_decodes_as_generate(tiny_named, tmp_path):
    """A Marian folder whose decoder starts with EOS: the config says "eos", the carried tokenizer
    starts with EOS, and greedy decoding from it gives generate's tokens."""
    folder = Path(shutil.copytree(tiny_named("marian-swish-tied").folder, tmp_path / "model"))
    for name in ("config.json", "generation_config.json"):
        settings = json.loads((folder / name).read_text())
        settings["decoder_start_token_id"] = 0  # the tiny model's EOS
        (folder / name).write_text(json.dumps(settings))
    record = convert(folder)
    tokenizer = tokenizer_from_record(record.tokenizer)
    assert (record.config.decoder_start, tokenizer.start_id, tokenizer.eos_id) == ("eos", 0, 0)
    src = torch.tensor([[*row, 0] for row in tokenizer.encode(["The cat sees the house."] * 2)])
    model = build_model(record, "explicit").double().eval()
    ours = greedy_decode(model, src, None, max_len=8, bos_id=tokenizer.start_id, eos_id=0,
                         banned_ids=record.banned_ids)
    hf = tiny.hf_float64(folder)
    assert torch.equal(ours, hf.generate(input_ids=src, num_beams=1, do_sample=False, max_length=8))
    assert ours[0, 0].item() == 0


def test_a_project_bos_start_needs_the_project_s_vocabulary(tiny_named, tmp_path):
    """A decoder that starts with this project's BOS id belongs to a model trained here; with
    Marian's own tokenizer (whose id 1 is a piece like any other) it is refused, named."""
    folder = Path(shutil.copytree(tiny_named("marian-swish-tied").folder, tmp_path / "model"))
    for name in ("config.json", "generation_config.json"):
        settings = json.loads((folder / name).read_text())
        settings["decoder_start_token_id"] = 1
        (folder / name).write_text(json.dumps(settings))
    with pytest.raises(ValueError, match=r"the decoder starts with this project's BOS id \(1\), but the "
                                         r"tokenizer is not this project's joint sentencepiece vocabulary"):
        convert(folder)


def test_every_tensor_is_read_or_known_and_of_its_shape(tiny_named):
    checkpoint = tiny_named("fsmt-untied")
    model, _, family = load_hf_model(checkpoint.folder)
    tensors = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers())}
    config = checkpoint.record.config

    def refused(changed: dict, said: str) -> None:
        with pytest.raises(ValueError, match=re.escape(said)):
            canonical_weights(changed, family, config)

    refused({**tensors, "model.encoder.layernorm_embedding.weight": torch.ones(16)},
            "model.encoder.layernorm_embedding.weight: a tensor the map does not read")
    refused({**tensors, "model.decoder.layers.1.fc1.weight": torch.zeros(31, 16)},
            "decoder.layers.1.ff.w1.weight: model.decoder.layers.1.fc1.weight has shape (31, 16), "
            "expected (32, 16)")
    refused({name: tensor for name, tensor in tensors.items() if "encoder_attn.k_proj" not in name},
            "decoder.layers.0.cross_attn.wk.weight: no model.decoder.layers.0.encoder_attn.k_proj.weight")
    table = tensors["model.decoder.embed_positions.weight"]
    refused({**tensors, "model.encoder.embed_positions.weight": table.roll(1, dims=0)},
            "model.encoder.embed_positions.weight: differs from the 'fairseq' table")


def test_both_families_are_listed():
    assert [family.architecture for family in FAMILIES.values()] == ["MarianMTModel",
                                                                     "FSMTForConditionalGeneration"]


def test_converting_twice_gives_the_same_weights(tiny_named):
    checkpoint = tiny_named("marian-relu-two")
    again = convert(checkpoint.folder)
    assert again.config == checkpoint.record.config
    assert all(torch.equal(again.weights[name], tensor) for name, tensor in checkpoint.record.weights.items())


def test_the_map_read_backwards_gives_hugging_face_s_tensors_back(tiny_named):
    """marian_model (the hf-marian row of compare.py) holds exactly the converted checkpoint's
    tensors where Hugging Face keeps them."""
    checkpoint = tiny_named("marian-relu-two")
    config, pad = checkpoint.record.config, checkpoint.record.config.pad_id
    rebuilt = marian_model(config, checkpoint.record.weights, start_id=pad, eos_id=0).state_dict()
    original = tiny.hf_library().MarianMTModel.from_pretrained(checkpoint.folder).state_dict()
    names = [name for name in original if "embed_positions" not in name]
    assert names and all(torch.equal(rebuilt[name], original[name]) for name in names)


def test_marian_model_refuses_a_config_it_cannot_compute(tiny_named):
    config = tiny_named("marian-relu-two").record.config.replace(final_norm=True)
    with pytest.raises(ValueError, match="needs final_norm=False"):
        marian_model(config, {}, start_id=2, eos_id=0)


def test_translating_a_fairseq_model_without_sacremoses_names_the_extra(tiny_named, monkeypatch, tmp_path):
    path = save(tiny_named("fsmt-tied").record, tmp_path / "fsmt.pt")
    monkeypatch.setitem(sys.modules, "sacremoses", None)  # import sacremoses raises ImportError
    with pytest.raises(SystemExit) as exit_info:
        translate.main([str(path), "Hello."])
    assert exit_info.value.code == ('python -m seq2seq.translate: error: a fairseq (FSMT) tokenizer needs '
                                    'sacremoses: pip install -e ".[hf]"')


def test_a_tokenizer_that_does_not_fit_the_model_is_refused(tiny_named):
    model, tokenizer, family = load_hf_model(tiny_named("marian-swish-tied").folder)
    model.config.eos_token_id = 3
    with pytest.raises(ValueError, match=r"EOS id: the tokenizer's 0, the model's 3"):
        convert_loaded(model, tokenizer, family, source="test")


@pytest.mark.parametrize("name", ["marian-relu-two", "fsmt-untied"])
def test_a_checkpoint_saved_in_shards_converts_to_the_same_model(name, tiny_named, tmp_path):
    """The same weights saved in several safetensors files behind an index (as large
    checkpoints are): the conversion holds the same tensors and settings as the one file's."""
    whole = tiny_named(name)
    sharded = tmp_path / "sharded"
    shutil.copytree(whole.folder, sharded)
    (sharded / "model.safetensors").unlink()
    load_hf_model(whole.folder)[0].save_pretrained(sharded, max_shard_size="20KB")
    shards = sorted(path.name for path in sharded.glob("model-*.safetensors"))
    assert len(shards) > 1 and (sharded / "model.safetensors.index.json").exists()
    record = convert(sharded)
    assert record.weights.keys() == whole.record.weights.keys()
    for key, tensor in whole.record.weights.items():
        assert torch.equal(record.weights[key], tensor), key
    assert (record.config, record.banned_ids, record.tokenizer.keys()) == (
        whole.record.config, whole.record.banned_ids, whole.record.tokenizer.keys())
