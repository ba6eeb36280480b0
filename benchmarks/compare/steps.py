"""The timed steps: each ``*_step`` builds a call without arguments that the timers repeat.

    step = forward_backward(model, batch)   # forward, NLL, backward; no optimiser
    step()

The decode modes (``DECODE_MODES``) each return the (B, L) ids they produced: greedy with the
model's key/value cache (the torch reference has none and recomputes), greedy by full
recompute, and beam search with the paper's beam of 4.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks.compare.dropout_masks import inductor_with_aten_masks
from common.random_batch import Batch
from seq2seq.data.ids import BOS_ID, timing_eos_id
from seq2seq.search.beam import BEAM_SIZE, beam_search
from seq2seq.search.greedy import greedy_decode

Autocast = Callable[[], contextlib.AbstractContextManager]  # a fresh precision region per call

# "decode": greedy, cached where the model has a cache; "decode_uncached": greedy by full
# recompute; "beam": beam search of BEAM_SIZE hypotheses, cached where the model has a cache
DECODE_MODES = ("decode", "decode_uncached", "beam")

# the fused kernels of nn.Transformer's eval fast path: seeing them means the path was taken
TORCH_FAST_PATH_OPS = {"aten::_transformer_encoder_layer_fwd", "aten::_native_multi_head_attention"}


def autocast_region(device: str, dtype: torch.dtype, enabled: bool) -> Autocast:
    """``torch.autocast(device, dtype)`` when ``enabled`` and not float32; else no region (the
    model itself is cast)."""
    if enabled and dtype != torch.float32:
        return lambda: torch.autocast(device, dtype=dtype)
    return contextlib.nullcontext


def forward_step(model: nn.Module, batch: Batch, autocast: Autocast = contextlib.nullcontext
                 ) -> Callable[[], Tensor]:
    """Inference: log-probs under no_grad (the caller puts the model in eval mode)."""

    def step() -> Tensor:
        with torch.no_grad(), autocast():
            return model(*batch.inputs())

    return step


def forward_backward(model: nn.Module, batch: Batch, autocast: Autocast = contextlib.nullcontext
                     ) -> Callable[[], None]:
    """Training without the optimiser: forward, token-level NLL, backward into fresh grads. On
    a ``compiled`` model the forward and its NLL run as one compiled graph, and so does their
    backward."""
    loss_of = model.loss_graph if isinstance(model, CompiledModel) else partial(token_nll, model)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with autocast():
            loss = loss_of(batch.inputs(), batch.labels)
        loss.backward()

    return step


def token_nll(model: nn.Module, inputs: tuple, labels: Tensor) -> Tensor:
    """The mean NLL of ``labels`` under the model's log-probs, padding ignored, in float32."""
    logp = model(*inputs)  # (B, T, V)
    return F.nll_loss(logp.flatten(0, 1).float(), labels.flatten(), ignore_index=model.config.pad_id)


def decode_step(model: nn.Module, batch: Batch, max_len: int,
                autocast: Autocast = contextlib.nullcontext, *, use_cache: bool = True
                ) -> Callable[[], Tensor]:
    """Greedy decoding of the batch's sources, ``max_len`` ids per row counting BOS; with the
    model's key/value cache where it has one, unless ``use_cache`` is False."""
    eos = timing_eos_id(model.config)

    def step() -> Tensor:
        with autocast():
            return greedy_decode(model, batch.src, batch.src_mask, max_len=max_len,
                                 bos_id=BOS_ID, eos_id=eos, use_cache=use_cache)

    return step


def beam_step(model: nn.Module, batch: Batch, max_len: int,
              autocast: Autocast = contextlib.nullcontext) -> Callable[[], Tensor]:
    """Beam search (beam 4, alpha 0.6) of the batch's sources: the best hypotheses' ids, at
    most ``max_len`` per row counting BOS."""
    eos = timing_eos_id(model.config)

    def step() -> Tensor:
        with autocast():
            return beam_search(model, batch.src, batch.src_mask, bos_id=BOS_ID, eos_id=eos,
                               beam_size=BEAM_SIZE, max_len=max_len).tokens

    return step


def decode_steps(model: nn.Module, batch: Batch, max_len: int,
                 autocast: Autocast = contextlib.nullcontext) -> dict[str, Callable[[], Tensor]]:
    """Every decode mode's step, by mode."""
    return {"decode": decode_step(model, batch, max_len, autocast),
            "decode_uncached": decode_step(model, batch, max_len, autocast, use_cache=False),
            "beam": beam_step(model, batch, max_len, autocast)}


# inductor's options for every compiled step: none beat the defaults on the base train step
# (docs/benchmarks.md, compiled training); what does is where dropout's masks come from
# (benchmarks.compare.dropout_masks). Tried and left out: "fallback_random", which stops inductor
# fusing dropout's multiply into its neighbours
COMPILE_OPTIONS: dict[str, object] = {}


class CompiledModel(nn.Module):
    """A model and its compiled steps: calling it runs the compiled forward; ``loss_graph`` is
    the forward with its NLL compiled as one graph (``forward_backward`` uses it), so the
    generator's log_softmax, the NLL and their backward are compiled too."""

    def __init__(self, model: nn.Module, options: dict) -> None:
        super().__init__()
        self.model = model  # the only registered module: parameters, train() and grads are its
        self.config = model.config
        training_options = {k: v for k, v in options.items() if k != "freezing"}
        self.__dict__["forward_graph"] = torch.compile(
            model, backend=inductor_with_aten_masks(options))
        self.__dict__["loss_graph"] = torch.compile(
            partial(token_nll, model), backend=inductor_with_aten_masks(training_options))

    def forward(self, *inputs: Tensor) -> Tensor:
        return self.forward_graph(*inputs)


def compiled(model: nn.Module, freeze: bool, *, profile_kernels: bool = False) -> CompiledModel:
    """``model`` compiled by inductor with ``COMPILE_OPTIONS`` and aten's dropout masks
    (benchmarks.compare.dropout_masks): its forward, and for ``forward_backward`` its forward with the
    NLL. ``freeze`` adds inductor freezing, which only inference graphs use: the weights are
    folded in as constants (on CPU prepacked for oneDNN's GEMMs), so the compiled eval forward
    must not outlive a change to them. The benchmarks never change them.
    ``profile_kernels`` names each inductor kernel in torch.profiler (benchmarks.studies.breakdown)."""
    options = dict(COMPILE_OPTIONS)
    if freeze:
        options["freezing"] = True
    if profile_kernels:
        options["cpp.enable_kernel_profile"] = True
    return CompiledModel(model, options)


def is_training(mode: str) -> bool:
    """Whether a mode ("forward", "train", "decode", "train_eager", ...) runs in train mode."""
    return mode.startswith("train")
