"""A damaged or mismatched Hugging Face folder is refused in one line naming the file, before
anything is written, and the folder is left byte for byte as it was.

Each case copies one tiny checkpoint per family (``seq2seq.hub.tiny``), damages one file, runs
``python -m seq2seq.convert`` in this process and checks: exit status 1 or 2, one line that names
the damaged file, nothing else on stderr, no traceback, no output file, and the folder's files
unchanged (their SHA-256 before and after).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from common.files import FileError
from seq2seq import convert as command
from seq2seq.hub.from_hf import convert, hf_library
from seq2seq.hub.hf_folder import read_folder

MARIAN, FSMT = "marian-relu-two", "fsmt-tied"  # the two families (one with two vocabularies, one tied)
PROG = "python -m seq2seq.convert: error: "
DECODER_EMBEDDING = "model.decoder.embed_tokens.weight"
FSMT_GENERATOR = "model.decoder.output_projection.weight"


# --- damage: each takes the folder and returns the name of the file the refusal must name -----


def truncate(name: str, keep: float = 0.5) -> Callable[[Path], str]:
    def damage(folder: Path) -> str:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[:int(len(data) * keep)])
        return name
    return damage


def empty(name: str) -> Callable[[Path], str]:
    def damage(folder: Path) -> str:
        (folder / name).write_bytes(b"")
        return name
    return damage


def random_bytes(name: str) -> Callable[[Path], str]:
    def damage(folder: Path) -> str:
        size = (folder / name).stat().st_size
        (folder / name).write_bytes(random.Random(0).randbytes(size))
        return name
    return damage


def delete(name: str) -> Callable[[Path], str]:
    def damage(folder: Path) -> str:
        (folder / name).unlink()
        return name
    return damage


def edit_config(**changes) -> Callable[[Path], str]:
    def damage(folder: Path) -> str:
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps(config))
        return "config.json"
    return damage


def edit_json(name: str, **changes) -> Callable[[Path], str]:
    def damage(folder: Path) -> str:
        settings = json.loads((folder / name).read_text())
        settings.update(changes)
        (folder / name).write_text(json.dumps(settings))
        return name
    return damage


def edit_weights(change: Callable[[dict], None]) -> Callable[[Path], str]:
    def damage(folder: Path) -> str:
        tensors = load_file(folder / "model.safetensors")
        change(tensors)
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        return "model.safetensors"
    return damage


def without_tokenizer(folder: Path) -> str:
    """The folder as model.save_pretrained alone writes it."""
    for path in folder.iterdir():
        if path.name not in ("config.json", "generation_config.json", "model.safetensors"):
            path.unlink()
    return "tokenizer_config.json"


def weights_as_pytorch_bin(folder: Path) -> str:
    """pytorch_model.bin in place of model.safetensors, one tensor missing from it."""
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.decoder.layers.1.fc2.weight"]
    torch.save(tensors, folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    return "pytorch_model.bin"


def wrong_kind_pytorch_bin(folder: Path) -> str:
    torch.save([1, 2, 3], folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    return "pytorch_model.bin"


def remove(*names: str) -> Callable[[dict], None]:
    def change(tensors: dict) -> None:
        for name in names:
            del tensors[name]
    return change


def add(name: str, tensor: torch.Tensor) -> Callable[[dict], None]:
    def change(tensors: dict) -> None:
        tensors[name] = tensor
    return change


def write(name: str, text: str) -> Callable[[Path], str]:
    def damage(folder: Path) -> str:
        (folder / name).write_text(text)
        return name
    return damage


def reshape(name: str) -> Callable[[dict], None]:
    def change(tensors: dict) -> None:
        tensors[name] = tensors[name][:-1].clone()
    return change


def twin_differs(name: str, twin: str) -> Callable[[dict], None]:
    """A tensor the config ties to ``twin`` saved beside it, with other values."""
    def change(tensors: dict) -> None:
        tensors[name] = tensors[twin] + 1
    return change


def layer_names(tensors: dict, stack: str, layer: int) -> list[str]:
    return [name for name in tensors if name.startswith(f"model.{stack}.layers.{layer}.")]


def drop_layer(stack: str, layer: int) -> Callable[[dict], None]:
    def change(tensors: dict) -> None:
        for name in layer_names(tensors, stack, layer):
            del tensors[name]
    return change


BOTH = (MARIAN, FSMT)
# case -> (the checkpoints it applies to, the damage, words the refusal must hold besides the file)
CASES: dict[str, tuple[tuple[str, ...], Callable[[Path], str], tuple[str, ...]]] = {
    # the weights
    "weights truncated": (BOTH, truncate("model.safetensors"), ("not a safetensors file",)),
    "weights empty": (BOTH, empty("model.safetensors"), ("is empty",)),
    "weights random": (BOTH, random_bytes("model.safetensors"), ("not a safetensors file",)),
    "weights missing": (BOTH, delete("model.safetensors"), ("no such file",)),
    "a tensor deleted": (BOTH, edit_weights(remove("model.decoder.layers.1.fc2.weight")),
                         ("no model.decoder.layers.1.fc2.weight", "(16, 32)")),
    "a tensor too many": (BOTH, edit_weights(add("model.encoder.layers.0.extra.weight", torch.ones(4))),
                          ("model.encoder.layers.0.extra.weight",)),
    "a tensor mis-shaped": (BOTH, edit_weights(reshape("model.encoder.layers.1.fc1.weight")),
                            ("model.encoder.layers.1.fc1.weight", "(31, 16)", "(32, 16)")),
    "a tied twin differs": ((MARIAN,), edit_weights(twin_differs("lm_head.weight", DECODER_EMBEDDING)),
                            ("lm_head.weight", DECODER_EMBEDDING, "ties")),
    "a tied twin differs (fsmt)": ((FSMT,), edit_weights(twin_differs(FSMT_GENERATOR, DECODER_EMBEDDING)),
                                   (FSMT_GENERATOR, DECODER_EMBEDDING, "ties")),
    "a layer missing from the weights": (BOTH, edit_weights(drop_layer("decoder", 1)),
                                         ("decoder_layers", "model.decoder.layers.1.")),
    "pytorch_model.bin with a tensor deleted": (BOTH, weights_as_pytorch_bin,
                                                ("no model.decoder.layers.1.fc2.weight",)),
    "pytorch_model.bin not a state dict": (BOTH, wrong_kind_pytorch_bin, ("not a state dict",)),
    # config.json
    "3 layers in the config, 2 in the weights": (BOTH, edit_config(encoder_layers=3, decoder_layers=3),
                                                 ("encoder_layers", "3", "model.encoder.layers.2.")),
    "1 layer in the config, 2 in the weights": (BOTH, edit_config(encoder_layers=1, decoder_layers=1),
                                                ("encoder_layers", "1", "model.encoder.layers.1.")),
    "FFN width in the config disagrees": (BOTH, edit_config(encoder_ffn_dim=64, decoder_ffn_dim=64),
                                          ("fc1.weight", "(32, 16)", "(64, 16)")),
    "d_model in the config disagrees": (BOTH, edit_config(d_model=32), ("has shape", "config.json implies")),
    "pad_token_id beyond the vocabulary": (BOTH, edit_config(pad_token_id=1000), ("pad_token_id", "1000")),
    "eos_token_id negative": (BOTH, edit_config(eos_token_id=-1), ("eos_token_id", "-1")),
    "a size that is not a number": (BOTH, edit_config(d_model="16"), ("d_model",)),
    "heads that do not divide d_model": (BOTH, edit_config(encoder_attention_heads=3,
                                                           decoder_attention_heads=3),
                                         ("encoder_attention_heads", "3")),
    "config truncated": (BOTH, truncate("config.json"), ("not JSON",)),
    "config empty": (BOTH, empty("config.json"), ("empty",)),
    "config missing": (BOTH, delete("config.json"), ("no such file",)),
    "config a list": (BOTH, write("config.json", "[1]"), ("JSON list",)),
    # the generation settings
    "generation_config.json truncated": (BOTH, truncate("generation_config.json"), ("not JSON",)),
    "generation_config.json random": (BOTH, random_bytes("generation_config.json"), ()),
    "generation_config.json bad_words_ids not a list of lists": (
        BOTH, write("generation_config.json", '{"bad_words_ids": 5}'), ("bad_words_ids",)),
    "generation_config.json's decoder start not config.json's": (
        BOTH, edit_json("generation_config.json", decoder_start_token_id=3),
        ("decoder_start_token_id is 3",)),
    # the tokenizer
    "saved without its tokenizer": (BOTH, without_tokenizer, ("no such file", "tokenizer")),
    "tokenizer_config.json missing": (BOTH, delete("tokenizer_config.json"), ("no such file",)),
    "tokenizer_config.json truncated": (BOTH, truncate("tokenizer_config.json"), ("not JSON",)),
    "special_tokens_map.json truncated": (BOTH, write("special_tokens_map.json", '{"unk_token": "<u'),
                                          ("not JSON",)),
    "source.spm missing": ((MARIAN,), delete("source.spm"), ("no such file",)),
    "target.spm missing": ((MARIAN,), delete("target.spm"), ("no such file",)),
    "target.spm zero bytes": ((MARIAN,), empty("target.spm"), ("is empty",)),
    "target.spm random": ((MARIAN,), random_bytes("target.spm"), ("not a sentencepiece model",)),
    "vocab.json missing": ((MARIAN,), delete("vocab.json"), ("no such file",)),
    "vocab.json truncated": ((MARIAN,), truncate("vocab.json"), ("not JSON",)),
    "vocab.json without <unk>": ((MARIAN,), write("vocab.json", '{"</s>": 0}'), ("<unk>",)),
    "target_vocab.json truncated": ((MARIAN,), truncate("target_vocab.json"), ("not JSON",)),
    "merges.txt missing": ((FSMT,), delete("merges.txt"), ("no such file",)),
    "merges.txt empty": ((FSMT,), empty("merges.txt"), ("is empty",)),
    "vocab-src.json missing": ((FSMT,), delete("vocab-src.json"), ("no such file",)),
    "vocab-tgt.json missing": ((FSMT,), delete("vocab-tgt.json"), ("no such file",)),
    "vocab-tgt.json truncated": ((FSMT,), truncate("vocab-tgt.json"), ("not JSON",)),
    "vocab-src.json a list": ((FSMT,), write("vocab-src.json", "[]"), ("JSON list",)),
}
PARAMS = [pytest.param(name, case, id=f"{name}-{case}") for case, (names, _, _) in CASES.items()
          for name in names]


def hashes(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative name -> SHA-256 of its bytes)."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture
def copy_of(tiny_named, tmp_path):
    """A fresh copy of the tiny checkpoint ``name``, to damage."""
    def copy(name: str) -> Path:
        return Path(shutil.copytree(tiny_named(name).folder, tmp_path / "model"))
    return copy


def refusal(capfd, argv: list[str]) -> tuple[int, str]:
    """The command's exit status and its whole stderr, run in this process (as Python would
    print a SystemExit message)."""
    with pytest.raises(SystemExit) as exit_info:
        command.main(argv)
    code = exit_info.value.code
    out, err = capfd.readouterr()
    assert out == "", out
    if isinstance(code, str):
        err, code = err + code + "\n", 1
    return code, err


@pytest.mark.parametrize(("name", "case"), PARAMS)
def test_a_damaged_folder_is_one_line_naming_the_file(copy_of, tmp_path, capfd, name, case):
    folder = copy_of(name)
    _, damage, words = CASES[case]
    damaged = folder / damage(folder)
    before = hashes(folder)
    output = tmp_path / "out" / "model.pt"
    capfd.readouterr()
    code, err = refusal(capfd, [str(folder), "--output", str(output)])
    assert code in (1, 2)
    assert err.count("\n") == 1 and err.startswith(PROG), err
    assert "Traceback" not in err
    assert str(damaged) in err, err
    for word in words:
        assert word in err, (word, err)
    assert hashes(folder) == before
    assert not output.exists() and not (output.parent.exists() and any(output.parent.iterdir()))


@pytest.mark.parametrize("name", BOTH)
@pytest.mark.parametrize("inside", ["model.safetensors", "config.json", ".", "new/model.pt", "link.pt"])
def test_the_output_never_lands_on_the_input(copy_of, tmp_path, capfd, name, inside):
    folder = copy_of(name)
    if inside == "link.pt":  # a link outside the folder to a file in it
        output = tmp_path / "link.pt"
        output.symlink_to(folder / "model.safetensors")
    else:
        output = folder / inside
    before = hashes(folder)
    code, err = refusal(capfd, [str(folder), "--output", str(output)])
    assert code in (1, 2)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert str(output) in err and "input" in err, err
    assert hashes(folder) == before


def test_a_missing_generation_config_is_a_named_default(copy_of, tmp_path, capfd):
    """No generation_config.json: the settings transformers derives from config.json, said in the
    output line, never silently."""
    folder = copy_of(MARIAN)
    (folder / "generation_config.json").unlink()
    output = tmp_path / "model.pt"
    command.main([str(folder), "--output", str(output)])
    out, _ = capfd.readouterr()
    assert out.count("\n") == 1
    assert "no generation_config.json" in out and "config.json" in out
    assert "never generated" not in out  # the tiny config.json forbids nothing
    assert output.is_file()


def test_a_killed_write_leaves_the_old_output(copy_of, tmp_path, capfd, monkeypatch):
    """The model file is written beside its place and renamed: a write that dies half-way
    leaves the previous output as it was, and no partial file."""
    folder = copy_of(FSMT)
    output = tmp_path / "model.pt"
    output.write_bytes(b"the previous output")

    def dies(payload, file):
        file.write(b"half a model")
        raise KeyboardInterrupt

    monkeypatch.setattr("seq2seq.storage.model_file.torch.save", dies)
    with pytest.raises(KeyboardInterrupt):
        command.main([str(folder), "--output", str(output)])
    assert output.read_bytes() == b"the previous output"
    assert [path.name for path in tmp_path.iterdir() if path.name != "model"] == ["model.pt"]


@pytest.mark.slow  # a process of its own: importing transformers takes seconds
def test_the_command_s_own_stderr_is_one_line(copy_of, tmp_path):
    """The real process: exit status 1, one line on stderr, nothing on stdout (the in-process
    cases above stand for the rest)."""
    folder = copy_of(MARIAN)
    edit_config(encoder_layers=3, decoder_layers=3)(folder)
    before = hashes(folder)
    result = subprocess.run([sys.executable, "-m", "seq2seq.convert", str(folder), "--output",
                             str(tmp_path / "model.pt")], capture_output=True, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert result.returncode == 1
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(PROG) and "config.json" in result.stderr
    assert hashes(folder) == before and not (tmp_path / "model.pt").exists()


@pytest.mark.parametrize("field", ["pad_token_id", "eos_token_id"])
def test_transformers_warns_nothing_before_the_one_line_refusal(copy_of, field):
    """transformers warns of a special id outside the vocabulary while it reads config.json
    (once per process: its record of warnings given is cleared first, so the case does not
    depend on the tests run before it); the converter's one-line refusal says it alone."""
    folder = copy_of(MARIAN)
    edit_config(**{field: 1000})(folder)
    records = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    library = logging.getLogger("transformers")
    logging.Logger.warning_once.cache_clear()
    library.addHandler(handler)
    try:
        with pytest.raises(FileError, match=rf"config\.json: {field} 1000 is outside the vocabulary"):
            read_folder(folder)
    finally:
        library.removeHandler(handler)
    assert [record.getMessage() for record in records if record.levelno >= logging.WARNING] == []


def test_a_tensor_transformers_changes_on_load_is_refused(tiny_named, monkeypatch):
    """The converter reads transformers' model only once it holds exactly the file's tensors."""
    cls = hf_library().FSMTForConditionalGeneration
    original = cls.from_pretrained

    def loads_another_value(*args, **kwargs):
        model = original(*args, **kwargs)
        with torch.no_grad():
            model.model.encoder.layers[0].fc1.bias.add_(1)
        return model

    monkeypatch.setattr(cls, "from_pretrained", loads_another_value)
    with pytest.raises(ValueError, match=r"model.safetensors: transformers loaded model.encoder.layers.0."
                                         r"fc1.bias other than the file holds it"):
        convert(tiny_named(FSMT).folder)


def test_a_hub_name_is_read_from_the_folder_huggingface_hub_fetches(tiny_named, monkeypatch, tmp_path, capfd):
    """A hub name: its files, fetched by huggingface_hub, are checked like a folder's, and a fetch
    that fails is one line naming the hub name (no network here: the fetch is stood in for)."""
    import huggingface_hub

    folder = tiny_named(MARIAN).folder
    fetched = []

    def fetch(name, allow_patterns):
        fetched.append((name, allow_patterns))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fetch)
    record = convert("Helsinki-NLP/opus-mt-tiny")
    assert record.settings["hub"]["source"] == "Helsinki-NLP/opus-mt-tiny"
    assert fetched[0][0] == "Helsinki-NLP/opus-mt-tiny" and "model.safetensors*" in fetched[0][1]
    capfd.readouterr()  # transformers' loading bars, until the command turns them off
    code, err = refusal(capfd, ["Helsinki-NLP/opus-mt-tiny", "--output", str(folder / "model.pt")])
    assert code == 1 and "is inside the input" in err and err.count("\n") == 1, err

    def offline(name, allow_patterns):
        raise OSError("We have no connection\nor a second line")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    code, err = refusal(capfd, ["Helsinki-NLP/opus-mt-tiny", "--output", str(tmp_path / "model.pt")])
    assert code == 1 and err.count("\n") == 1, err
    assert "Helsinki-NLP/opus-mt-tiny: cannot fetch it from the Hugging Face hub (OSError: We have no" in err
