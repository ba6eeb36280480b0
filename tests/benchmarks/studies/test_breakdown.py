"""benchmarks.studies.breakdown: a profiled train step's self time in groups that add up to the whole."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from benchmarks.compare.dropout_masks import KEEP_MASK_OP
from benchmarks.studies.breakdown import GROUPS, coverage, group_of, grouped, profile_train_step
from common.config import TransformerConfig
from common.random_batch import random_batch
from variants import build

CONFIG = TransformerConfig(d_model=32, n_heads=4, n_layers=1, d_ff=64, src_vocab_size=40,
                           tgt_vocab_size=40, max_seq_len=16)


def check_partition(groups: dict, total: float,
                    present=("matmul", "optimizer", "embedding/generator", "dropout")) -> None:
    assert list(groups) == list(GROUPS)
    assert total > 0
    assert sum(groups.values()) == pytest.approx(total, rel=1e-6)  # self times partition the total
    assert coverage(groups, total) == pytest.approx(100 * (1 - groups["other"] / total))
    for group in present:
        assert groups[group] > 0, group


@pytest.mark.parametrize("variant, dtype", [("explicit", torch.float32), ("torch", torch.float32),
                                            ("fused", torch.bfloat16)])
def test_the_groups_sum_to_the_profiled_total(variant, dtype):
    model = build(variant, CONFIG, seed=0).to(dtype)
    check_partition(*profile_train_step(model, random_batch(CONFIG, 2, 6, 5), repeats=1))


@pytest.mark.slow  # compiling takes tens of seconds on a busy 2-core box
def test_a_compiled_step_is_grouped_by_its_kernels_names():
    groups, total = profile_train_step(build("explicit", CONFIG, seed=0), random_batch(CONFIG, 2, 6, 5),
                                       compile=True, repeats=1)
    # the masks come from the suite's keep_mask (benchmarks.compare.dropout_masks): dropout
    check_partition(groups, total)
    assert groups["elementwise"] > 0 and groups["attention"] > 0  # inductor's kernels, not "other"


def test_operators_are_grouped_by_name():
    assert group_of("aten::addmm") == "matmul"
    assert group_of("aten::einsum") == "matmul"
    assert group_of("aten::_softmax_backward_data") == "attention"
    assert group_of("aten::native_layer_norm_backward") == "layernorm"
    assert group_of("aten::native_dropout") == "dropout"
    assert group_of("aten::embedding_dense_backward") == "embedding/generator"
    assert group_of("aten::threshold_backward") == "elementwise"
    assert group_of("aten::clamp_min") == "elementwise"
    assert group_of("Optimizer.step#Adam.step") == "optimizer"
    assert group_of("LayerNormFunctionBackward") == "layernorm"  # mathfirst's own autograd.Function
    assert group_of("aten::view") == "other"


def event(name: str, start: float, end: float, self_time: float, parent=None, *,
          gpu: float = 0.0, self_gpu: float = 0.0, device=DeviceType.CPU) -> SimpleNamespace:
    """A profiler event as ``grouped`` reads one: an operator's CPU and GPU times, or a kernel's."""
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end),
                           cpu_parent=parent, cpu_time_total=end - start, self_cpu_time_total=self_time,
                           device_time_total=gpu, self_device_time_total=self_gpu, device_type=device)


def test_ops_inside_a_keep_mask_count_as_dropout():
    mask = event(KEEP_MASK_OP, 0, 10, 1)
    events = [mask, event("aten::uniform_", 1, 6, 5, mask), event("aten::gt", 6, 10, 4, mask),
              event("aten::gt", 20, 27, 7)]  # a comparison of the model's own, outside
    groups, total = grouped(events)
    assert total == 17
    assert groups["dropout"] == 10 and groups["elementwise"] == 7


def test_on_cuda_operators_carry_their_kernels_gpu_time_counted_once():
    linear = event("aten::linear", 0, 10, 2, gpu=30, self_gpu=0)  # its time is its child's kernel
    events = [linear, event("aten::addmm", 1, 9, 8, linear, gpu=30, self_gpu=30),
              event("ampere_sgemm_128x64_tn", 2, 5, 3, gpu=30, self_gpu=30, device=DeviceType.CUDA),
              event("triton_poi_fused_native_dropout_relu_0", 11, 12, 1, gpu=5, self_gpu=5)]
    groups, total = grouped(events, gpu_time=True)
    assert total == 35
    assert groups["matmul"] == 30 and groups["elementwise"] == 5  # the kernel's own event: not again
    cpu_groups, cpu_total = grouped(events)
    assert cpu_total == 11 and cpu_groups["matmul"] == 10


def test_inductor_kernels_are_grouped_by_the_ops_they_fuse():
    assert group_of("graph_0_cpp_fused__softmax_masked_fill_3") == "attention"
    assert group_of("cpp_fused__log_softmax_nll_loss_forward_7") == "embedding/generator"
    assert group_of("cpp_fused__softmax_native_dropout_2") == "attention"  # fused: the other op
    assert group_of("graph_0_cpp_fused_native_dropout_view_7") == "dropout"  # dropout alone
    assert group_of("cpp_fused_native_dropout_relu_view_13") == "elementwise"
    assert group_of("cpp_fused_add_native_layer_norm_5") == "layernorm"
    assert group_of("cpp_fused_add_div_mean_mul_sub_9") == "elementwise"
    assert group_of("## Call CompiledFxGraph fabc ##") == "other"
    # on CUDA: triton kernels, named the same way
    assert group_of("triton_per_fused__softmax_masked_fill_3") == "attention"
    assert group_of("triton_red_fused__log_softmax_nll_loss_forward_7") == "embedding/generator"
    assert group_of("triton_poi_fused_native_dropout_2") == "dropout"
    assert group_of("triton_poi_fused_add_native_layer_norm_5") == "layernorm"
    assert group_of("triton_poi_fused_add_mul_9") == "elementwise"


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["explicit", "fused"])
def test_on_cuda_the_groups_partition_the_kernels_time(variant):
    model = build(variant, CONFIG, seed=0).cuda()
    check_partition(*profile_train_step(model, random_batch(CONFIG, 2, 6, 5, device="cuda"),
                                        repeats=1))
