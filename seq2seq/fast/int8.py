"""A model's linears on int8 weights with int8 products: a lever of the fast decoding path
(``seq2seq.fast.static_search``), for a float32 model on an x86 CPU, as CTranslate2's int8 does.

    fast = with_int8_linears(model.eval())   # a copy; ``model`` is left as it is
    StaticGreedy(fast, max_len=65, bos_id=1, eos_id=2)(src, src_mask)

Each ``nn.Linear`` of the encoder, decoder and generator becomes an ``Int8Linear``: its weight
quantized once, per output channel and symmetrically (row o's step ``max|W[o]| / 127``, zero
point 0, integers in [-127, 127]), and packed for fbgemm; each call quantizes its input per call
and per tensor (dynamic quantization: the whole input's range, zero included, on 7 bits), sums
the int8 products in int32, and hands back float32 with the bias added. Everything between the
linears (attention over the cache, the norms, the softmax) stays float32. Per channel rather
than per tensor: a row's step follows its own largest weight, and fbgemm runs both at the same
speed at decode shapes (8 to 128 rows, 512 -> 2048). The input's step is the whole call's, so
a sentence's log-probs depend (slightly) on the others in its batch, and a cached step's on
which rows are still decoding, where float32's depend on neither.

Why 7-bit inputs (``REDUCE_RANGE``): on a CPU without VNNI (AVX2 alone) fbgemm adds pairs of
uint8 x int8 products in int16, which full-range inputs overflow; with 7 bits no pair can.

The kernels are fbgemm's (``QUANTIZED_ENGINE``). PyTorch picks a quantized engine per process
(``torch.backends.quantized.engine``) and a weight is packed for the engine current when it is
packed; a packed weight then runs its own engine's kernel whatever the setting later. So the
setting is switched to fbgemm while the weights are packed and given back at once
(``fbgemm_packing``): nothing is set for the process, and the copy computes the same whatever
engine another library chose. On PyTorch's x86 engine, the default here, linears run fbgemm too;
its onednn engine was slower at decode shapes.

PyTorch APIs it uses that are deprecated with ``torch.ao.quantization`` (its successor, torchao,
is not a dependency), and may change or go in a torch release: ``torch.quantize_per_channel``
(the int8 weight), ``torch.ops.quantized.linear_prepack``, ``linear_dynamic`` and
``linear_relu_dynamic`` and ``linear_unpack`` (fbgemm's packing, product, product with ReLU and
the way back), ``torch.backends.quantized``
(the engine). ``torch.quantize_per_channel`` warns once per process that quantized tensors are
deprecated (a ``UserWarning``, "torch.quantize_per_tensor, torch.quantize_per_channel and other
quantized tensor creation functions ... are deprecated"): it is silenced while the weights are
packed, since a user asked for this copy and the warning names no call of theirs. Other
warnings pass.

What it serves: fused, as ``seq2seq.fast.onednn`` does (any other model is a ``ValueError``
naming what it lacks). The copy is a snapshot of the weights (build a new one after the model
changes), for inference only: its parameters do not require grad, and an ``Int8Linear``
refuses an input that requires grad while grad is enabled (the quantized product has no
backward). The int8 weights live in the packed form alone: the copy's ``state_dict`` does not
hold them, and ``.to()`` does not move them (save and move the model, not the copy).

Shape legend:
    N  any leading dims (B, T)   D_in  input features   D_out  output features
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from common.checks import model_device, model_dtype
from seq2seq.fast.onednn import SERVED, replace_linears, unpackable

QUANTIZED_ENGINE = "fbgemm"  # the quantized engine whose kernels the int8 linears run (x86)
REDUCE_RANGE = True  # each call's input on 7 bits: no int16 pair sum can overflow without VNNI
WEIGHT_LEVELS = 127  # a weight row's integers lie in [-127, 127]: step max|W[o]| / 127
# the start of the UserWarning torch.quantize_per_channel gives once per process (a regex)
DEPRECATION = r"torch\.quantize_per_tensor, torch\.quantize_per_channel .*deprecated"


def int8_available() -> bool:
    """Whether this PyTorch build has fbgemm, the quantized engine the int8 linears run (x86)."""
    return QUANTIZED_ENGINE in torch.backends.quantized.supported_engines


@contextmanager
def fbgemm_packing() -> Iterator[None]:
    """Within: the quantized engine is fbgemm (what a weight packed now runs) and the
    quantized-tensor deprecation warning is silenced; both given back on leaving."""
    engine = torch.backends.quantized.engine
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=DEPRECATION, category=UserWarning)
        torch.backends.quantized.engine = QUANTIZED_ENGINE
        try:
            yield
        finally:
            torch.backends.quantized.engine = engine


class Int8Linear(nn.Module):
    """``nn.Linear``'s product on an int8 weight (per output channel, symmetric) packed for
    fbgemm when built; each call quantizes its float32 input (per tensor, 7 bits), multiplies in
    int8 with int32 sums, and hands back float32, bias added."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()  # (D_out, D_in)
        steps = weight.abs().amax(dim=1) / WEIGHT_LEVELS  # (D_out,): each row's step
        steps = torch.where(steps > 0, steps, torch.ones_like(steps))  # an all-zero row: any step
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        zero_points = torch.zeros_like(steps, dtype=torch.long)  # (D_out,): symmetric
        with fbgemm_packing():
            int8 = torch.quantize_per_channel(weight, steps.double(), zero_points, 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(int8, bias)  # fbgemm's packed weight

    def int8_weight(self) -> tuple[Tensor, Tensor]:
        """The weight as held: (D_out, D_in) int8 integers and (D_out,) float64 steps, the weight
        their product (unpacked from fbgemm's form)."""
        weight, _ = torch.ops.quantized.linear_unpack(self.packed)
        return weight.int_repr(), weight.q_per_channel_scales()

    def forward(self, x: Tensor) -> Tensor:
        self.check_input(x)
        return torch.ops.quantized.linear_dynamic(x, self.packed, REDUCE_RANGE)  # (N, D_out) float32

    def relu(self, x: Tensor) -> Tensor:
        """max(0, ``self(x)``), the ReLU applied in the same call to the float32 result (fbgemm's
        ``linear_relu_dynamic``): the same numbers without a pass of their own."""
        self.check_input(x)
        return torch.ops.quantized.linear_relu_dynamic(x, self.packed, REDUCE_RANGE)  # (N, D_out)

    @staticmethod
    def check_input(x: Tensor) -> None:
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("Int8Linear is inference-only (the quantized product has no backward): "
                               "call it under torch.no_grad() or torch.inference_mode()")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per channel"


def with_int8_linears(model: nn.Module) -> nn.Module:
    """A copy of ``model`` (CPU, float32) whose encoder, decoder and generator ``nn.Linear``
    modules are ``Int8Linear``: a snapshot of its weights in int8, for inference. ``ValueError``
    where fbgemm cannot run them, or where the model has no encoder, decoder and generator built
    of ``nn.Linear`` (every registered variant but fused)."""
    if problem := unpackable(model):
        raise ValueError(f"with_int8_linears serves {SERVED}, whose encoder, decoder and generator hold "
                         f"nn.Linear: {type(model).__module__}.{type(model).__qualname__} {problem}")
    device, precision = model_device(model), model_dtype(model)
    if device.type != "cpu" or precision != torch.float32:
        raise ValueError(f"int8 linears need a float32 model on the CPU, got {precision} on {device}")
    if not int8_available():
        raise ValueError(f"int8 linears run PyTorch's {QUANTIZED_ENGINE} quantized engine (x86 CPUs); this "
                         f"build has {', '.join(torch.backends.quantized.supported_engines)}")
    return replace_linears(model, Int8Linear)
