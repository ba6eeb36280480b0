"""The architecture picture (docs/images/architecture.svg) cannot go stale or link nowhere: it is
what ``python -m scripts.architecture`` writes now, it draws Figure 1's boxes, and each box's
links land on the line that defines a symbol of that style's code."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from scripts import architecture
from tests.docs.pages import ROOT

SVG = "{http://www.w3.org/2000/svg}"
# Figure 1 of the paper, read off the figure (plus the one architecture's final norms), bottom-up
FIGURE_ONE = ["Input Embedding", "Output Embedding", "Positional Encoding", "Multi-Head Attention",
              "Masked Multi-Head Attention", "Add & Norm", "Feed Forward", "Final LayerNorm", "Linear",
              "Softmax"]
DEFINITION = re.compile(r"^\s*(?:class|def)\s+(\w+)|^\s*(\w+)\s*[:=]")


@pytest.fixture(scope="module")
def tree() -> ET.Element:
    return ET.fromstring((ROOT / architecture.PICTURE).read_text(encoding="utf-8"))


def test_the_committed_picture_is_what_the_command_writes():
    committed = (ROOT / architecture.PICTURE).read_text(encoding="utf-8")
    assert committed == architecture.picture(ROOT), (
        f"{architecture.PICTURE} is stale: run `{architecture.COMMAND}` and commit it")


def test_every_box_of_figure_one_is_drawn(tree):
    labels = " | ".join(text.text or "" for text in tree.iter(f"{SVG}text") if text.get("class") == "label")
    for box in FIGURE_ONE:
        assert box in labels, f"no box says {box!r}"
    assert labels.count("Add & Norm") == 5, "2 in an encoder layer, 3 in a decoder layer"


def test_each_box_links_the_three_styles_to_a_definition(tree):
    boxes = [group for group in tree.iter(f"{SVG}g") if group.get("class") == "box"]
    assert len(boxes) >= 14
    for box in boxes:
        anchors = box.findall(f"{SVG}a")
        assert ["".join(a.itertext()) for a in anchors] == ["explicit", "einsum", "mathfirst"], box.get(
            "data-concept")
        for anchor in anchors:
            href = anchor.get("href")
            match = re.fullmatch(r"\.\./\.\./([\w/]+\.py)#L(\d+)", href)
            assert match, href
            path, line = ROOT / match[1], int(match[2])
            assert path.is_file(), href
            assert match[1].startswith(("variants/", "common/")), href
            text = path.read_text(encoding="utf-8").splitlines()[line - 1]
            assert DEFINITION.match(text), f"{href} lands on {text.strip()!r}, not a definition"


def test_a_concept_the_map_lacks_is_one_line_naming_it(monkeypatch, capsys):
    monkeypatch.setattr(architecture, "picture",
                        lambda root: architecture.row_for("no such concept", []))
    assert architecture.main([]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'no such concept'" in err
