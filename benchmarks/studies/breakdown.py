"""Where a train step's time goes: one profiled step (forward, NLL, backward, Adam) per variant,
its operators' self time grouped by what they do.

    groups, total = profile_train_step(model, batch)               # eager, the model's dtype
    groups, total = profile_train_step(model, batch, compile=True)  # the suite's compiled step

On CPU the times are the operators' own CPU time; on CUDA (a model and batch on the GPU) they
are the GPU time of the kernels each operator launched itself, so the groups still partition
the step.

Groups, by operator name (the step's own aten ops, their backward ops, and inductor's kernels,
which are named after the aten ops fused into them):
  matmul             mm, addmm, bmm, baddbmm, linear, matmul, einsum (their own time: the
                     contraction's planning and reshapes)
  attention          softmax and its backward, masked_fill, fused attention kernels (the score
                     matmuls themselves count as matmul)
  layernorm          native_layer_norm and its backward
  dropout            native_dropout, bernoulli, rand and their backward; in a compiled step,
                     every op inside the suite's keep_mask (benchmarks.compare.dropout_masks)
  elementwise        other element-wise and reduction work (add, mul, relu, copy, sum, ...)
  embedding/generator  embedding and its backward, log_softmax, NLL
  optimizer          every op inside the optimizer's step
  other              everything else: views, allocation, autograd's and the compiled graphs'
                     own bookkeeping
An inductor kernel (``cpp_fused_*`` on CPU, ``triton_*_fused_*`` on CUDA) fuses several ops;
it goes to the first group in ``KERNEL_ORDER`` whose op it names (a fused softmax-and-dropout
kernel counts as attention), to dropout if it is dropout alone, else to element-wise
(dropout's multiply fused into a ReLU counts as element-wise). Self time is exclusive, so the
groups sum to the profiled total (the top-level events' time).
"""

from __future__ import annotations

import re
from collections import defaultdict

import torch
from torch import nn
from torch.autograd import DeviceType

from benchmarks.compare.dropout_masks import KEEP_MASK_OP
from benchmarks.compare.memory import quiet_stderr
from benchmarks.compare.steps import compiled, forward_backward
from common.random_batch import Batch

GROUPS = ("matmul", "attention", "layernorm", "dropout", "elementwise", "embedding/generator",
          "optimizer", "other")
NAMED_GROUPS = GROUPS[:-1]  # the groups the coverage counts
OPTIMIZER_REGION = "breakdown::optimizer"
# what runs inside these is theirs; KEEP_MASK_OP draws a compiled step's dropout masks
REGIONS = {OPTIMIZER_REGION: "optimizer", KEEP_MASK_OP: "dropout"}
# inductor's kernels: cpp_fused_<aten ops>_<n> on CPU, triton_{poi,red,per,tem}_fused_<ops>_<n> on CUDA
INDUCTOR_KERNEL = re.compile(r"(?:cpp|triton_[a-z]+)_fused_")
NAMES = {
    "matmul": {"mm", "addmm", "bmm", "baddbmm", "_addmm_activation", "addbmm", "dot", "mv",
               "linear", "matmul", "einsum", "_mkldnn_linear", "mkldnn_linear"},
    "attention": {"_softmax", "_softmax_backward_data", "softmax", "masked_fill", "masked_fill_",
                  "scaled_dot_product_attention", "_scaled_dot_product_attention_math",
                  "_scaled_dot_product_flash_attention_for_cpu",
                  "_scaled_dot_product_flash_attention_for_cpu_backward",
                  "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
                  "_scaled_dot_product_efficient_attention",
                  "_scaled_dot_product_efficient_attention_backward",
                  "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
                  # the CUDA kernels' own ops, which the _scaled_dot_product_* ops call
                  "_flash_attention_forward", "_flash_attention_backward",
                  "_efficient_attention_forward", "_efficient_attention_backward"},
    "layernorm": {"native_layer_norm", "native_layer_norm_backward", "layer_norm"},
    "dropout": {"native_dropout", "native_dropout_backward", "bernoulli_", "bernoulli", "dropout",
                "rand_like", "rand", "uniform_"},
    "embedding/generator": {"embedding", "embedding_backward", "embedding_dense_backward",
                            "_log_softmax", "_log_softmax_backward_data", "log_softmax",
                            "nll_loss_forward", "nll_loss_backward", "nll_loss", "nll_loss_nd",
                            "nll_loss2d_forward", "nll_loss2d_backward", "index_select",
                            "index_add_", "embedding_renorm_"},
    "elementwise": {"add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "relu", "relu_",
                    "clamp_min", "clamp_min_", "threshold_backward", "copy_", "clone", "fill_",
                    "zero_", "zeros", "zeros_like", "ones", "sum", "mean", "var", "std", "sqrt",
                    "rsqrt", "pow", "neg", "exp", "where", "sin", "cos", "to", "_to_copy",
                    "contiguous", "cat", "ones_like", "empty_like", "addcmul_", "addcdiv_", "lerp_",
                    "maximum", "eq", "ne", "lt", "gt", "le", "ge", "logical_not", "logical_and",
                    "logical_or", "bitwise_and", "bitwise_not", "bitwise_or", "reciprocal", "abs",
                    "masked_fill_backward", "sum_to_size", "any", "all", "max", "amax", "aminmax",
                    "cumsum", "arange", "full", "scalar_tensor", "_local_scalar_dense", "var_mean",
                    "sign", "square", "sqrt_", "mul_backward"},
}
# inductor kernel names: the first group whose op a kernel's name contains; generator ops come
# before attention's ("_log_softmax" contains "_softmax")
KERNEL_ORDER = (
    ("embedding/generator", ("embedding", "log_softmax", "nll_loss")),
    ("attention", ("softmax", "masked_fill", "scaled_dot_product")),
    ("layernorm", ("native_layer_norm", "layer_norm")),
)
# a kernel of only these is dropout; dropout's multiply fused into other work counts as that work
DROPOUT_KERNEL_OPS = ("native_dropout_backward", "native_dropout", "bernoulli", "rand_like", "rand",
                      "view", "expand", "clone")


def is_dropout_kernel(fused: str) -> bool:
    """Whether an inductor kernel's fused op names (``native_dropout_view_7``) are dropout's only."""
    for op in DROPOUT_KERNEL_OPS:
        fused = fused.replace(op, "")
    return not fused.strip("_0123456789")


def group_of(name: str) -> str:
    """The group of one profiled event by its name (``aten::mm`` -> "matmul",
    ``cpp_fused__softmax_masked_fill_3`` -> "attention")."""
    if name.startswith("Optimizer.") or name == OPTIMIZER_REGION:  # its hook (Optimizer.step#Adam.step)
        return "optimizer"
    if "LayerNorm" in name:  # a Python-level LayerNorm (mathfirst's LayerNormFunction and its backward)
        return "layernorm"
    if kernel := INDUCTOR_KERNEL.search(name):
        fused = name[kernel.end():]
        named = next((group for group, ops in KERNEL_ORDER if any(op in fused for op in ops)), None)
        # every other fused kernel is element-wise or a reduction
        return named or ("dropout" if is_dropout_kernel(fused) else "elementwise")
    op = name.removeprefix("aten::")
    return next((group for group, names in NAMES.items() if op in names), "other")


def coverage(groups: dict[str, float], total: float) -> float:
    """The share of ``total`` the named groups account for, in %: all but "other"."""
    return 100 * sum(groups[g] for g in NAMED_GROUPS) / total


def profile_train_step(model: nn.Module, batch: Batch, lr: float = 1e-4, *, compile: bool = False,
                       repeats: int = 3) -> tuple[dict[str, float], float]:
    """A warmed-up train step of ``model`` (in the dtype it holds, where it is; ``batch`` on the
    same device) profiled ``repeats`` times: the fastest profile's grouped self time in µs and
    its total (the summed time of the top-level events), also in µs. The fastest, because on a
    shared machine a descheduled thread charges its wait to whichever op is running.
    ``compile`` profiles the step compare.py --compile times (benchmarks.compare.steps.compiled), with
    inductor's kernels recorded by name."""
    on_cuda = next(model.parameters()).is_cuda
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
    model.train()
    train = forward_backward(compiled(model, freeze=False, profile_kernels=True) if compile
                             else model, batch)

    def step() -> None:
        train()  # zero_grad, forward, NLL, backward
        with torch.profiler.record_function(OPTIMIZER_REGION):
            optimizer.step()
        if on_cuda:
            torch.cuda.synchronize()  # every kernel of the step ends inside the profile

    activities = [torch.profiler.ProfilerActivity.CPU]
    if on_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    step()  # warm up: compiling, first-call set-up and the optimizer's state
    profiles = []
    for _ in range(repeats):
        with quiet_stderr(), torch.profiler.profile(activities=activities) as profiler:
            step()
        profiles.append(grouped(profiler.events(), gpu_time=on_cuda))
    return min(profiles, key=lambda groups_total: groups_total[1])


def grouped(events, *, gpu_time: bool = False) -> tuple[dict[str, float], float]:
    """Self time per group (inside a ``REGIONS`` event by region, the rest by name) and the
    top-level total: of the operators' CPU time, or with ``gpu_time`` of the GPU kernels each
    operator launched. Only operators (CPU-side events) count; a kernel's own event would count
    its time twice."""
    self_time, time = ("self_device_time_total", "device_time_total") if gpu_time \
        else ("self_cpu_time_total", "cpu_time_total")
    operators = [e for e in events if e.device_type == DeviceType.CPU]
    times: dict[str, float] = defaultdict(float)
    regions = [(e.time_range, REGIONS[e.name]) for e in operators if e.name in REGIONS]
    total = 0.0
    for event in operators:
        if event.cpu_parent is None:
            total += getattr(event, time)
        start = event.time_range.start
        region = next((group for r, group in regions if r.start <= start <= r.end), None)
        times[region or group_of(event.name)] += getattr(event, self_time)
    return {group: times.get(group, 0.0) for group in GROUPS}, total
