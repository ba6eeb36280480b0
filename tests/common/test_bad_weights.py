"""Weight import lets no bad value in: finiteness is judged in the model's own dtype (after the
cast), complex and meta tensors are refused by name, and a refused import changes nothing."""

from __future__ import annotations

import pytest
import torch

from common.config import TransformerConfig
from common.weights import export_weights, import_weights
from variants import build

CONFIG = TransformerConfig(d_model=16, n_heads=2, n_layers=1, d_ff=16, dropout=0.0,
                           src_vocab_size=11, tgt_vocab_size=11, max_seq_len=8)


def weights_with(name: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
    """The seeded canonical weights with ``name`` replaced by ``value``."""
    return {**export_weights(build("explicit", CONFIG, seed=0)), name: value}


def bias_of(value: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A canonical (d_model,) bias holding one ``value`` among zeros."""
    tensor = torch.zeros(CONFIG.d_model, dtype=dtype)
    tensor[3] = value
    return tensor


BAD = {  # case -> (model dtype, canonical name, bad tensor, what the message must say)
    # 1e6 is finite as given (float32) and inf in float16, whose largest value is 65504
    "overflows-float16": (torch.float16, "encoder.norm.bias", bias_of(1e6),
                          r"key encoder\.norm\.bias: holds NaN or inf once cast to the model's "
                          r"torch\.float16"),
    "overflows-float32": (torch.float32, "decoder.norm.bias", bias_of(1e300, torch.float64),
                          r"key decoder\.norm\.bias: holds NaN or inf once cast to the model's "
                          r"torch\.float32"),
    "nan": (torch.float32, "encoder.norm.bias", bias_of(float("nan")),
            r"key encoder\.norm\.bias: holds NaN or inf$"),
    "complex": (torch.float32, "encoder.norm.bias", bias_of(1.0).to(torch.complex64) * 1j,
                r"key encoder\.norm\.bias: complex dtype torch\.complex64; weights are real"),
    "meta": (torch.float32, "generator.bias", torch.empty(CONFIG.tgt_vocab_size, device="meta"),
             r"key generator\.bias: a meta tensor, which holds no values"),
}


@pytest.mark.parametrize(("dtype", "name", "bad", "match"), list(BAD.values()), ids=list(BAD))
def test_a_bad_weight_is_refused_by_name_and_changes_nothing(dtype, name, bad, match):
    model = build("explicit", CONFIG, seed=1).to(dtype)
    before = {key: tensor.clone() for key, tensor in model.state_dict().items()}
    with pytest.raises(ValueError, match=match):
        import_weights(model, weights_with(name, bad))
    after = model.state_dict()
    assert all(torch.equal(after[key], tensor) for key, tensor in before.items())


def test_a_value_that_fits_the_dtype_is_imported():
    """The other side: 60000 is finite in float16 (largest 65504), and arrives as given."""
    model = build("explicit", CONFIG).half()
    import_weights(model, weights_with("encoder.norm.bias", bias_of(60000.0)))
    assert export_weights(model)["encoder.norm.bias"][3].item() == 60000.0
