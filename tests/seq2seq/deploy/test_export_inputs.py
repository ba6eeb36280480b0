"""What ``export_onnx`` takes is checked before any work: anything but a model of this suite
is a TypeError naming what it takes, and nothing is written."""

from __future__ import annotations

import pytest
from torch import nn

onnx_runtime = pytest.importorskip("seq2seq.deploy.onnx_runtime", reason="the deploy extra is not installed")


@pytest.mark.parametrize("model", [{"d_model": 16}, None, "model.pt", nn.Linear(2, 2)])
def test_export_onnx_of_something_not_a_model_is_a_type_error(model, tmp_path):
    """A dict used to fail with AttributeError: 'dict' object has no attribute 'config'."""
    target = tmp_path / "export"
    named = type(model).__name__
    with pytest.raises(TypeError, match=rf"model must be an nn\.Module of this suite.*, got {named}$"):
        onnx_runtime.export_onnx(model, target, exporter="torchscript")
    assert not target.exists()
