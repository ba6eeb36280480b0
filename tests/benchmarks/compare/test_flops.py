"""The analytic FLOP count behind compare.py's GFLOP/s and "% of matmul peak" equals what
torch's own counter (``torch.utils.flop_counter.FlopCounterMode``) sees every row run: the
forward pass, and a train step's forward and backward.

The counter counts matrix multiplies (mm, addmm, bmm, baddbmm, SDPA) at 2 FLOPs per
multiply-add and nothing else, which is what ``forward_flops`` documents it counts: softmax,
LayerNorm, dropout, embeddings, bias and residual adds and the loss are left out by both. One
difference, documented: the counter charges an SDPA kernel's backward for recomputing QKᵀ, which
the formula, counting the computation rather than a kernel's schedule, leaves out.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from benchmarks.compare.workload import forward_flops, train_flops
from common.config import TransformerConfig
from common.random_batch import random_batch
from variants import VARIANTS, build

# S != T and every size distinct, so a formula that swaps two of them counts something else
CONFIG = TransformerConfig(d_model=16, n_heads=2, n_layers=2, d_ff=24, dropout=0.0, src_vocab_size=11,
                           tgt_vocab_size=13, max_seq_len=16)
BATCH, SRC_LEN, TGT_LEN = 2, 7, 5
aten = torch.ops.aten


def cpu_attention(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def cpu_attention_backward(grad_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                           **kwargs) -> int:
    return sdpa_backward_flop_count(grad_shape, query_shape, key_shape, value_shape)


# The CPU's own SDPA kernel, missing from the counter's table, counted as its other SDPA kernels
CPU_ATTENTION = {aten._scaled_dot_product_flash_attention_for_cpu: cpu_attention,
                 aten._scaled_dot_product_flash_attention_for_cpu_backward: cpu_attention_backward}

def counted(row: str) -> tuple[int, int, bool]:
    """FLOPs the counter sees in one forward pass of ``row`` and in its backward, and whether its
    attention ran as SDPA kernels."""
    model = build(row, CONFIG, seed=0).train()  # train mode: no inference fast path; dropout is 0
    inputs = random_batch(CONFIG, BATCH, SRC_LEN, TGT_LEN, seed=0).inputs()
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as forward:
        log_probs = model(*inputs)  # (B, T, V)
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as backward:
        log_probs.sum().backward()
    sdpa = any("scaled_dot_product" in str(op) for op in forward.get_flop_counts()["Global"])
    return forward.get_total_flops(), backward.get_total_flops(), sdpa


def recomputed_scores(config: TransformerConfig, batch: int, src_len: int, tgt_len: int) -> int:
    """What an SDPA kernel's backward adds, by the counter's convention: it recomputes QKᵀ
    (2·B·Sq·Sk·D over all heads) for each of a layer's three attentions. The formula counts
    the computation's matmuls, not a kernel's recomputation (documented in ``forward_flops``)."""
    s, t = src_len, tgt_len
    return config.n_layers * 2 * batch * config.d_model * (s * s + t * t + t * s)


@pytest.mark.parametrize("row", VARIANTS)
def test_forward_and_train_step_flops_are_what_torch_counts(row):
    forward, backward, sdpa = counted(row)
    assert forward == forward_flops(CONFIG, BATCH, SRC_LEN, TGT_LEN)
    recomputed = recomputed_scores(CONFIG, BATCH, SRC_LEN, TGT_LEN) if sdpa else 0
    assert forward + backward == train_flops(CONFIG, BATCH, SRC_LEN, TGT_LEN) + recomputed
