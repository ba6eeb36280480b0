"""Where a train step's time goes: one profiled step (forward, NLL, backward, Adam) per variant,
its operators' self time grouped by what they do.

    profile = profile_train_step(model, batch)   # {op name: self µs}, the optimizer apart
    groups = group_times(profile)                # {group: µs}, every µs in exactly one group

Groups, by aten operator name (the step's own ops and their backward ops):
  matmul             mm, addmm, bmm, baddbmm, matmul-backed kernels
  attention          softmax and its backward, masked_fill, fused attention kernels (the score
                     matmuls themselves count as matmul)
  layernorm          native_layer_norm and its backward
  dropout            native_dropout, bernoulli and their backward
  elementwise        other element-wise and reduction work (add, mul, relu, copy, sum, ...)
  embedding/generator  embedding and its backward, log_softmax, NLL
  optimizer          every op inside the optimizer's step
  other              everything else (views, autograd bookkeeping, unlisted ops)
Self time is exclusive, so the groups sum to the profiled total (the top-level events' time).
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.memory import quiet_stderr
from common.batches import Batch

GROUPS = ("matmul", "attention", "layernorm", "dropout", "elementwise", "embedding/generator",
          "optimizer", "other")
OPTIMIZER_REGION = "breakdown::optimizer"
NAMES = {
    "matmul": {"mm", "addmm", "bmm", "baddbmm", "_addmm_activation", "addbmm", "dot", "mv"},
    "attention": {"_softmax", "_softmax_backward_data", "softmax", "masked_fill", "masked_fill_",
                  "_scaled_dot_product_flash_attention_for_cpu",
                  "_scaled_dot_product_flash_attention_for_cpu_backward",
                  "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
                  "_scaled_dot_product_efficient_attention",
                  "_scaled_dot_product_efficient_attention_backward",
                  "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward"},
    "layernorm": {"native_layer_norm", "native_layer_norm_backward", "layer_norm"},
    "dropout": {"native_dropout", "native_dropout_backward", "bernoulli_", "bernoulli", "dropout"},
    "embedding/generator": {"embedding", "embedding_backward", "embedding_dense_backward",
                            "_log_softmax", "_log_softmax_backward_data", "nll_loss_forward",
                            "nll_loss_backward", "nll_loss", "nll_loss_nd", "index_select",
                            "index_add_", "embedding_renorm_"},
    "elementwise": {"add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "relu", "relu_",
                    "threshold_backward", "copy_", "clone", "fill_", "zero_", "zeros_like",
                    "sum", "mean", "var", "std", "sqrt", "rsqrt", "pow", "neg", "exp", "where",
                    "sin", "cos", "to", "_to_copy", "contiguous", "cat", "ones_like", "empty_like",
                    "addcmul_", "addcdiv_", "lerp_", "maximum", "eq", "ne", "lt", "ge", "logical_not",
                    "logical_and", "bitwise_and", "bitwise_not", "_unsafe_view", "reciprocal", "abs",
                    "masked_fill_backward", "expand_as", "sum_to_size", "any", "all", "max", "amax",
                    "aminmax", "cumsum", "arange", "full", "scalar_tensor", "_local_scalar_dense"},
}


def group_of(name: str) -> str:
    """The group of one operator by its name (``aten::mm`` -> "matmul")."""
    op = name.removeprefix("aten::")
    return next((group for group, names in NAMES.items() if op in names), "other")


def profile_train_step(model: nn.Module, batch: Batch, lr: float = 1e-4
                       ) -> tuple[dict[str, float], float]:
    """One warmed-up train step of ``model`` profiled: its grouped self time in µs and the
    profiled total (the summed time of the top-level events), also in µs."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
    model.train()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        logp = model(*batch.inputs())
        loss = F.nll_loss(logp.flatten(0, 1).float(), batch.labels.flatten(),
                          ignore_index=model.config.pad_id)
        loss.backward()
        with torch.profiler.record_function(OPTIMIZER_REGION):
            optimizer.step()

    step()  # warm up: first-call set-up and the optimizer's state
    with quiet_stderr(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]
                                                ) as profiler:
        step()
    return grouped(profiler.events())


def grouped(events) -> tuple[dict[str, float], float]:
    """Self time per group (the optimizer by region, the rest by name) and the top-level total."""
    times: dict[str, float] = defaultdict(float)
    regions = [e.time_range for e in events if e.name == OPTIMIZER_REGION]
    total = 0.0
    for event in events:
        if event.cpu_parent is None:
            total += event.cpu_time_total
        inside = any(r.start <= event.time_range.start <= r.end for r in regions)
        times["optimizer" if inside else group_of(event.name)] += event.self_cpu_time_total
    return {group: times.get(group, 0.0) for group in GROUPS}, total
