"""Measure what each source's departure from the one architecture does to the output.

    python -m scripts.deviations            # Markdown table on stdout

Each row starts from the same seeded model (the explicit variant, float64, eval) and applies one
departure of a source text from the one architecture (docs/architecture.md), then reports the largest
|Δ log-prob| against the unchanged model on one fixed batch with source and target padding.
Where a departure is a re-parametrisation it is applied as an exact edit of the canonical
weights (e.g. scaling scores by sqrt(D) instead of sqrt(Dh) == scaling W_q by 1/sqrt(H)); where
it is another formula, the model's own modules are swapped for the source's (found by type on
the built model) or, for the mask fill value, the model's one fill is given the source's number.
The batch is ``common.random_batch.random_batch`` (4 sequences, 12 source and 10 target tokens, row r
ends in r padding tokens); the fill-value rows also empty one source row (all padding).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from common.cli import Parser, first_line
from common.config import TransformerConfig
from common.masks import padding_mask
from common.random_batch import random_batch
from common.weights import export_weights, import_weights
from variants import build

CONFIG = TransformerConfig(d_model=64, n_heads=4, n_layers=2, d_ff=128, dropout=0.1,
                           src_vocab_size=100, tgt_vocab_size=100, max_seq_len=64)
SEED = 0
EMPTY_SOURCE_ROW = 3  # the row whose source is all padding where a row asks for one


def inputs(config: TransformerConfig, empty_source_row: bool = False) -> tuple[Tensor, ...]:
    """(src, tgt, src_mask, tgt_mask) of the fixed batch, optionally with one all-padding source."""
    batch = random_batch(config, batch=4, src_len=12, tgt_len=10, seed=SEED)
    if not empty_source_row:
        return batch.inputs()
    src = batch.src.clone()
    src[EMPTY_SOURCE_ROW] = config.pad_id
    return src, batch.tgt, padding_mask(src, config.pad_id), batch.tgt_mask


def log_probs(model: nn.Module, dtype=torch.float64, empty_source_row: bool = False) -> Tensor:
    """The model's log-probs on the fixed batch, run in ``dtype``, returned in float64."""
    with torch.no_grad():
        return model.to(dtype)(*inputs(model.config, empty_source_row)).double()


def baseline(config: TransformerConfig = CONFIG) -> nn.Module:
    """The seeded explicit model in float64 and eval mode, which every row departs from."""
    return build("explicit", config, seed=SEED).eval().double()


def edited(edit: Callable[[dict[str, Tensor]], None]) -> nn.Module:
    """The baseline with its canonical weights edited in place by ``edit``."""
    model = baseline()
    state = export_weights(model)
    edit(state)
    import_weights(model, state)
    return model


class SourceOneLayerNorm(nn.Module):
    """Source 1's formula: alpha * (x - mean) / (std + eps) + bias, with the unbiased std."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.alpha, self.bias, self.eps = norm.alpha, norm.bias, norm.eps

    def forward(self, x: Tensor) -> Tensor:
        mean, std = x.mean(-1, keepdim=True), x.std(-1, keepdim=True)
        return self.alpha * (x - mean) / (std + self.eps) + self.bias


def replace_modules(model: nn.Module, kind: type, make: Callable[[nn.Module], nn.Module]) -> nn.Module:
    """Swap every submodule of type ``kind`` for ``make(submodule)``, in place."""
    for name, module in list(model.named_modules()):
        if isinstance(module, kind):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, make(module))
    return model


class FillMaskedScoresWith(TorchFunctionMode):
    """Inside this context, masked scores are filled with ``value``, as a source does.

    The suite fills masked scores with ``finfo(dtype).min`` (``common.masks.mask_scores``); this
    torch function mode sees each ``masked_fill`` the model runs and gives the ones with that
    value the source's number instead. The model's code and modules stay as they are.
    ``filled`` counts the rewritten calls, so a model that fills another way cannot pass
    unnoticed.
    """

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value
        self.filled = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.masked_fill, torch.masked_fill):
            scores, mask, value = *args[:2], args[2] if len(args) > 2 else kwargs["value"]
            if scores.is_floating_point() and value == torch.finfo(scores.dtype).min:
                self.filled += 1
                return func(scores, mask, self.value)
        return func(*args, **kwargs)


def filled_with(value: float, model: nn.Module, dtype=torch.float64) -> Tensor:
    """``log_probs`` with an all-padding source row, masked scores filled with ``value``."""
    with FillMaskedScoresWith(value) as fill:
        result = log_probs(model, dtype, empty_source_row=True)
    if fill.filled == 0:
        raise RuntimeError("the model filled no masked scores with finfo(dtype).min; nothing to measure")
    return result


def source_three_table(max_len: int, d_model: int) -> Tensor:
    """The table as source 3 builds it: float32 throughout."""
    table = torch.zeros(max_len, d_model)
    position = torch.arange(max_len).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    table[:, 0::2] = torch.sin(position * div_term)
    table[:, 1::2] = torch.cos(position * div_term)
    return table


def scale_rows(state: dict[str, Tensor], suffix: str, factor: float) -> None:
    """Multiply every canonical tensor whose name ends in ``suffix`` by ``factor``, in place."""
    for name in state:
        if name.endswith(suffix):
            state[name] *= factor


def max_delta(a: Tensor, b: Tensor) -> str:
    """max |a - b| as a table cell, or how many (batch, position) rows of ``a`` are not finite."""
    if not torch.isfinite(a).all():
        return f"NaN/inf in {int((~torch.isfinite(a)).any(-1).sum())} of {a.shape[0] * a.shape[1]} positions"
    return f"{(a - b).abs().max().item():.3g}"


def rows() -> list[tuple[str, str, str, str]]:
    """(source, departure, this suite, measured effect) for each departure, in table order."""
    reference = log_probs(baseline())
    config = CONFIG
    out = []

    def add(source: str, departure: str, suite: str, result: str) -> None:
        out.append((source, departure, suite, result))

    # --- source 1 (explicit) -----------------------------------------------------------------
    model = baseline()
    model = replace_modules(model, type(model.encoder.norm), SourceOneLayerNorm)
    add("1 explicit", "LayerNorm divides by the unbiased std + eps (eps outside the root)",
        "biased variance, eps inside the root", max_delta(log_probs(model), reference))
    pre = baseline(config.replace(norm_first=True))
    import_weights(pre, export_weights(baseline()), config=None)
    add("1 explicit", "text describes pre-norm, code is post-norm",
        "post-norm by default, pre-norm with `norm_first=True`; same weights, the other mode:",
        max_delta(log_probs(pre), reference))
    result = max_delta(filled_with(float("-inf"), baseline()), reference)
    add("1 explicit", "masked scores filled with -inf", "filled with finfo(dtype).min",
        f"0 where a row has a real key; with an all-padding source: {result}")
    add("1 explicit", "one `vocabsize` for source and target", "`src_vocab_size`, `tgt_vocab_size`",
        "n/a (shapes)")

    # --- source 2 (einsum) -------------------------------------------------------------------
    heads = config.n_heads
    add("2 einsum", "scores scaled by sqrt(embed_size) = sqrt(D), not sqrt(Dh)", "sqrt(Dh)",
        max_delta(log_probs(edited(lambda s: (scale_rows(s, "wq.weight", heads**-0.5),
                                              scale_rows(s, "wq.bias", heads**-0.5)))), reference))
    unscaled = edited(lambda s: (scale_rows(s, "src_embed.weight", config.d_model**-0.5),
                                 scale_rows(s, "tgt_embed.weight", config.d_model**-0.5)))
    add("2 einsum", "embeddings not scaled by sqrt(D)", "scaled by sqrt(D)",
        max_delta(log_probs(unscaled), reference))
    learned = baseline()
    generator = torch.Generator().manual_seed(SEED)
    for module in (learned.src_pos, learned.tgt_pos):
        module.pe = torch.randn(module.pe.shape, generator=generator, dtype=torch.float64)
    add("2 einsum", "learned positions (nn.Embedding, N(0, 1) at init)", "fixed sinusoids",
        max_delta(log_probs(learned), reference))
    for norm_first in (False, True):
        with_norms = baseline(config.replace(norm_first=norm_first))
        no_final = baseline(config.replace(norm_first=norm_first))
        no_final.encoder.norm, no_final.decoder.norm = nn.Identity(), nn.Identity()
        mode = "pre-norm" if norm_first else "post-norm (the last sublayer already normalised)"
        add("2 einsum", "no final LayerNorm after either stack", "final norms, as nn.Transformer",
            f"{mode}: {max_delta(log_probs(no_final), log_probs(with_norms))}")
    add("2 einsum", "dropout after the norm: dropout(norm(x + sublayer))",
        "norm(x + dropout(sublayer))", "0 in eval (dropout is the identity); differs in training")
    shared = 3 * config.head_dim**2
    full = 3 * (config.d_model**2 + config.d_model)
    add("2 einsum", "one (Dh x Dh) Q/K/V projection shared by all heads, no bias",
        "full (D x D) projections with bias",
        f"another function class: {shared} Q/K/V weights per layer instead of {full}")
    finite_fill = log_probs(baseline(), empty_source_row=True)
    same = max_delta(filled_with(-1e20, baseline()), finite_fill)
    try:
        half = max_delta(filled_with(-1e20, baseline(), torch.float16), reference)
    except RuntimeError as error:  # masked_fill refuses a value the dtype cannot hold
        half = f"RuntimeError: {first_line(error)}"
    add("2 einsum", "masked scores filled with -1e20", "filled with finfo(dtype).min",
        f"float64, with an all-padding source: {same}; float16: {half}")

    # --- source 3 (mathfirst) ----------------------------------------------------------------
    table32 = baseline()
    for module in (table32.src_pos, table32.tgt_pos):
        module.pe = source_three_table(*module.pe.shape).double()
    # float32 sin/cos/exp round differently on different CPUs (vectorised kernels per
    # instruction set), so the cell states the bound the difference stays under, not its digits
    delta = (log_probs(table32) - reference).abs().max().item()
    eps32 = torch.finfo(torch.float32).eps
    add("3 mathfirst", "sinusoid table built in float32 (exp/log form)",
        "built in float64, cast where added",
        f"below float32's epsilon ({eps32:.3g}): rounding" if delta < eps32 else f"{delta:.3g}")
    return out


def main(argv: list[str] | None = None) -> int:
    Parser(prog="python -m scripts.deviations", description=__doc__.splitlines()[0]).parse_args(argv)
    torch.use_deterministic_algorithms(True)
    print(f"config: {CONFIG}, seed {SEED}, float64, eval; max |Δ log-prob| vs the one architecture\n")
    print("| source | departure | this suite | max abs Δ log-prob |")
    print("|---|---|---|---|")
    for row in rows():
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
