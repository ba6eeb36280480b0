"""A model's linears on oneDNN's matrix product, with weights packed once: a lever of the fast
decoding path (``seq2seq.fast.static_search``), for a float32 model on the CPU.

    fast = with_onednn_linears(model.eval())   # a copy; ``model`` is left as it is
    StaticGreedy(fast, max_len=65, bos_id=1, eos_id=2)(src, src_mask)
    half = with_onednn_linears(model.eval(), dtype=torch.bfloat16)   # weights packed in bfloat16

On CPU, PyTorch multiplies a float32 ``nn.Linear`` with MKL's SGEMM, and inductor's freezing packs
float32 weights for MKL as well; oneDNN's packed product (``torch.ops.mkldnn._linear_pointwise``,
what inductor runs for bfloat16 weights) is the same product summed in another order. Which one
is faster depends on the CPU: measured in docs/decoding.md.

With ``dtype=torch.bfloat16`` the packed weights are bfloat16: each product rounds its input to
bfloat16, sums in float32 inside oneDNN, and hands back float32, so everything between the
linears (attention over the cache, the norms, the softmax) stays float32. A decode step streams
every weight once, so half the bytes is the lever, and the encoder's products, over every source
position at once, run on the CPU's bfloat16 instructions; on a CPU without native bfloat16
(``common.bfloat16``) the same values come slower. How far its tokens agree with float32's is
measured in docs/results/cpu-bf16.md.

What it serves: a model whose ``encoder``, ``decoder`` and ``generator`` are modules built of
``nn.Linear`` (of the registered variants, fused: the row compare.py's onednn row and the static
decoders' ``onednn`` use); any other model is a ``ValueError`` naming what it lacks (explicit and
einsum have no ``generator``, torch no ``decoder``, mathfirst holds its weights as bare
parameters), never a copy with nothing packed. The encoder runs once per batch, the decoder and
generator once per step: every linear of a decode. The copy is a snapshot: it holds the weights
as they were when it was built, and goes on computing with them after the model's change; build
a new one then.
It is for inference only: the copy's parameters do not require grad, and a packed linear refuses
an input that requires grad while grad is enabled (oneDNN's packed product has no backward).

Shape legend:
    N  any leading dims (B, T)   D_in  input features   D_out  output features
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor, nn

from common.checks import model_device, model_dtype

PACKED_MODULES = ("encoder", "decoder", "generator")  # the modules a decode runs: their linears are packed
SERVED = "the fused row (variants.fused)"  # the registered variant whose modules hold nn.Linear


PACKED_DTYPES = (torch.float32, torch.bfloat16)  # the weights' dtypes a packed linear can hold


def packable_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes oneDNN packs and multiplies on this CPU: float32, and bfloat16 where it has
    bfloat16 kernels (AVX-512 at least; emulated without avx512_bf16 or amx_bf16)."""
    return PACKED_DTYPES if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)


class OneDnnLinear(nn.Module):
    """``nn.Linear``'s product through oneDNN, on a weight packed for it in ``dtype`` when built;
    its input is rounded to that dtype and its output handed back in the input's."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        weight = linear.weight.detach().to(dtype)  # (D_out, D_in)
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, None))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(dtype).clone())

    def forward(self, x: Tensor) -> Tensor:
        return self.product(x, "none")  # (N, D_out)

    def relu(self, x: Tensor) -> Tensor:
        """max(0, ``self(x)``), the ReLU applied by oneDNN to the product as it is written,
        without a pass of its own (to float32 rounding: oneDNN may pick another kernel for a
        product with a post-op)."""
        return self.product(x, "relu")  # (N, D_out)

    def product(self, x: Tensor, pointwise: str) -> Tensor:
        """The packed product with oneDNN's ``pointwise`` op on its result ("none" or "relu")."""
        if torch.is_grad_enabled() and any(tensor is not None and tensor.requires_grad
                                           for tensor in (x, self.packed_weight, self.bias)):
            raise RuntimeError("OneDnnLinear is inference-only (oneDNN's packed product has no backward): "
                               "call it under torch.no_grad() or torch.inference_mode()")
        product = torch.ops.mkldnn._linear_pointwise(x.to(self.packed_weight.dtype), self.packed_weight,
                                                     self.bias, pointwise, [], "")  # (N, D_out)
        return product.to(x.dtype)


def with_onednn_linears(model: nn.Module, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A copy of ``model`` (CPU, float32) whose encoder, decoder and generator ``nn.Linear``
    modules are ``OneDnnLinear`` with weights packed in ``dtype`` (float32 or bfloat16): a
    snapshot of its weights, for inference. ``ValueError`` where oneDNN cannot run them, or where
    the model has no encoder, decoder and generator built of ``nn.Linear`` (every registered
    variant but fused)."""
    if dtype not in PACKED_DTYPES:
        raise ValueError(f"with_onednn_linears packs weights in {' or '.join(map(str, PACKED_DTYPES))}, "
                         f"got {dtype!r}")
    if dtype not in packable_dtypes():
        raise ValueError(f"oneDNN has no {dtype} kernels on this CPU (they need AVX-512): pack in float32")
    if problem := unpackable(model):
        raise ValueError(f"with_onednn_linears serves {SERVED}, whose encoder, decoder and generator hold "
                         f"nn.Linear: {type(model).__module__}.{type(model).__qualname__} {problem}")
    device, model_precision = model_device(model), model_dtype(model)
    if device.type != "cpu" or model_precision != torch.float32 or not torch.backends.mkldnn.is_available():
        raise ValueError(f"oneDNN linears need a float32 model on a CPU with oneDNN (mkldnn available: "
                         f"{torch.backends.mkldnn.is_available()}), got {model_precision} on {device}")
    return replace_linears(model, lambda linear: OneDnnLinear(linear, dtype))


def replace_linears(model: nn.Module, pack: Callable[[nn.Linear], nn.Module]) -> nn.Module:
    """A copy of ``model`` for inference (no parameter requires grad) whose every ``nn.Linear``
    in ``PACKED_MODULES`` is ``pack(linear)``; ``model`` is left as it was."""
    packed = copy.deepcopy(model).requires_grad_(False)  # inference only: no graph through the copy
    for prefix in PACKED_MODULES:
        root = packed.get_submodule(prefix)
        linears = [(name, module) for name, module in root.named_modules() if isinstance(module, nn.Linear)]
        for name, module in linears:
            if not name:  # the module is itself a linear (the generator)
                setattr(packed, prefix, pack(module))
                continue
            parent, _, attribute = name.rpartition(".")
            setattr(root.get_submodule(parent), attribute, pack(module))
    return packed


def unpackable(model: nn.Module) -> str | None:
    """Why ``model`` has no encoder, decoder and generator linears to pack (as words after its
    class name), or None."""
    missing = [name for name in PACKED_MODULES if not isinstance(getattr(model, name, None), nn.Module)]
    if missing:
        return f"has no {' and no '.join(missing)} module"
    empty = [name for name in PACKED_MODULES
             if not any(isinstance(module, nn.Linear) for module in model.get_submodule(name).modules())]
    if empty:
        return f"holds no nn.Linear in its {' and '.join(empty)} (0 linears to pack)"
    return None
