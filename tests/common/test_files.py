"""The one way a file is read: each damaged kind is one FileError naming the file."""

import io
import json

import pytest

from common.files import FileError, check_output, read_json, read_stream_text, read_text, reading


@pytest.fixture
def damaged(tmp_path):
    """Each kind of damage a user's file can have, by name."""
    files = {"missing": tmp_path / "missing.json", "directory": tmp_path / "folder"}
    files["directory"].mkdir()
    for name, data in {"empty": b"", "truncated": b'{"rows": [1, 2', "random": bytes(range(256)) * 4,
                       "latin1": "café".encode("latin-1"), "list": b"[1, 2, 3]", "string": b'"a"',
                       "null": b"null", "true": b"true"}.items():
        files[name] = tmp_path / f"{name}.json"
        files[name].write_bytes(data)
    return files


@pytest.mark.parametrize("kind", ["missing", "directory", "empty", "truncated", "random", "latin1",
                                  "list", "string", "null", "true"])
def test_every_damaged_json_is_one_line_naming_the_file(damaged, kind):
    with pytest.raises(FileError) as caught:
        read_json(damaged[kind], dict, "a report")
    message = str(caught.value)
    assert message.startswith(f"{damaged[kind]}: ") and "\n" not in message
    assert isinstance(caught.value, ValueError)


def test_the_message_says_what_is_wrong(damaged):
    said = {}
    for kind in ("missing", "directory", "empty", "truncated", "latin1", "list", "true"):
        with pytest.raises(FileError) as caught:
            read_json(damaged[kind], dict, "a report")
        said[kind] = str(caught.value)
    assert "no such file" in said["missing"]
    assert "is a directory" in said["directory"]
    assert "is empty" in said["empty"]
    assert "is not JSON (line 1" in said["truncated"]
    assert "not UTF-8" in said["latin1"] and "0xe9" in said["latin1"]
    assert "holds a JSON list, not a report" in said["list"]
    assert "holds a JSON boolean" in said["true"]


def test_a_good_file_reads_as_its_value(tmp_path):
    path = tmp_path / "good.json"
    path.write_text(json.dumps({"rows": [1, 2]}), encoding="utf-8")
    assert read_json(path, dict, "a report") == {"rows": [1, 2]}
    assert read_json(path, (dict, list), "a report or runs") == {"rows": [1, 2]}
    assert read_text(path) == '{"rows": [1, 2]}'


def test_a_library_error_while_reading_is_one_line(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"\x00\x01")

    def library_read(_):
        raise RuntimeError("deep inside\nwith a second line")

    with pytest.raises(FileError, match=r"model\.bin: not a model \(RuntimeError: deep inside\)$"), \
            reading(path, "a model") as readable:
        library_read(readable)


def test_standard_input_that_is_not_utf8_is_named():
    with pytest.raises(FileError, match="standard input: is not UTF-8 text"):
        read_stream_text(io.BytesIO(b"caf\xe9\n"))
    assert read_stream_text(io.BytesIO("café\n".encode())) == "café\n"


def test_an_output_may_not_be_an_input_nor_inside_one(tmp_path):
    folder = tmp_path / "hf-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    for output in (folder / "config.json", folder / "model.safetensors", folder):
        with pytest.raises(FileError, match="input"):
            check_output(output, inputs=[folder])
    with pytest.raises(FileError, match="is the input"):
        check_output(tmp_path / "a.pt", inputs=[tmp_path / "a.pt"])
    assert check_output(tmp_path / "out" / "model.pt", inputs=[folder]) == tmp_path / "out" / "model.pt"


def test_an_output_under_a_file_is_refused_before_the_work(tmp_path):
    (tmp_path / "plain").write_text("x")
    with pytest.raises(FileError, match="is a file, not a directory"):
        check_output(tmp_path / "plain" / "out.json")
    with pytest.raises(FileError, match="is a directory"):
        check_output(tmp_path)
