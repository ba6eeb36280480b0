"""The decoder's linears on oneDNN's float32 matrix product, with weights packed once: a lever of
the fast decoding path (``seq2seq.decoding.static``), CPU float32 only.

    fast = with_onednn_linears(model.eval())   # a copy; ``model`` is left as it is
    StaticGreedy(fast, max_len=65, bos_id=1, eos_id=2)(src, src_mask)

On CPU, PyTorch multiplies a float32 ``nn.Linear`` with MKL's SGEMM, and inductor's freezing packs
float32 weights for MKL as well; oneDNN's packed product (``torch.ops.mkldnn._linear_pointwise``,
what inductor runs for bfloat16 weights) is the same product summed in another order. Which one
is faster depends on the CPU: measured in docs/decoding.md. The copy holds the weights as they
were: build a new one after changing the model's.

Shape legend:
    N  any leading dims (B, T)   D_in  input features   D_out  output features
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from common.checks import model_device, model_dtype

STEP_MODULES = ("decoder", "generator")  # the modules a decode step runs: their linears are packed


class OneDnnLinear(nn.Module):
    """``nn.Linear``'s product through oneDNN, on a weight packed for it when built."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach()  # (D_out, D_in)
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, None))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: Tensor) -> Tensor:
        # (N, D_out); no activation fused after it
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def with_onednn_linears(model: nn.Module) -> nn.Module:
    """A copy of ``model`` (CPU, float32) whose decoder and generator ``nn.Linear`` modules are
    ``OneDnnLinear``; ``ValueError`` where oneDNN cannot run them."""
    device, dtype = model_device(model), model_dtype(model)
    if device.type != "cpu" or dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        raise ValueError(f"oneDNN linears need a float32 model on a CPU with oneDNN (mkldnn available: "
                         f"{torch.backends.mkldnn.is_available()}), got {dtype} on {device}")
    packed = copy.deepcopy(model)
    for prefix in STEP_MODULES:
        root = packed.get_submodule(prefix)
        linears = [(name, module) for name, module in root.named_modules() if isinstance(module, nn.Linear)]
        for name, module in linears:
            if not name:  # the module is itself a linear (the generator)
                setattr(packed, prefix, OneDnnLinear(module))
                continue
            parent, _, attribute = name.rpartition(".")
            setattr(root.get_submodule(parent), attribute, OneDnnLinear(module))
    return packed
