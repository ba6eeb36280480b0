"""fused's cached decoder step written flat: one function walks the decoder layers over their
weights, keeps each layer's keys and values heads first, and attends by a matrix product, a
softmax and a matrix product. A lever of the fast decoding path, for an eager step:

    StaticGreedy(model.eval(), max_len=65, bos_id=1, eos_id=2, flat=True)(src, src_mask)
    StaticGreedy(with_int8_linears(model.eval()), max_len=65, bos_id=1, eos_id=2, flat=True)

``FlatDecoding(model)`` wraps fused (or its copy on packed or int8 linears,
``seq2seq.fast.onednn``, ``seq2seq.fast.int8``) and answers what ``StaticNextToken`` asks of a
model: ``project`` and ``generator`` are the model's; ``encode``, ``start_static_cache`` and
``static_step`` its own, over a ``FlatCache``. The step computes what fused's ``static_step``
computes (post- or pre-norm, the configured activation, the final norm): the tests hold it to
``decode_step`` at every position, and its decoders to ``greedy_decode`` and ``beam_search``.

Where a teaching step's time goes besides its matrix products, at one query per row, and what
this step does instead:

- Each sublayer is a module called through ``nn.Module.__call__``, dropout included (a no-op in
  eval). Here the step calls the projections, norms and activation only.
- The suite's bool masks become SDPA's additive mask in every step (``sdpa_mask``, per stack).
  Here the source's additive mask is built once per batch, and the target's is a buffer of which
  each step writes one slot: 0 where a key is written and not padding, -inf where not.
- Keys and values are cached heads merged, (B, max_len, D), and split into heads by a view that
  SDPA's CPU kernel copies. Here they are cached heads first, (B, H, max_len, Dh), so a step's
  heads are views of the cache.
- One SDPA call per attention, whose set-up outweighs its arithmetic at one query of 64 numbers
  per head. Here, softmax(q K^T / sqrt(Dh) + mask) V as two batched matrix products.
- The feed-forward's ReLU is a pass of its own over the hidden layer. Here, on the int8 and
  oneDNN copies, it runs inside the first linear's product (their ``relu``).
- Beam search moves every layer's cached rows before the step, and the step reads them later,
  from memory. Here each layer's move is made when the step reaches that layer
  (``FlatCache.layer``), so its attention reads the rows just gathered.
- The encoder and the cross-attention's key and value projection run on every token, padding
  included. Here, where the source mask is one key mask that leaves every source an open key
  (``open_tokens``), every product but attention's runs on the open tokens alone, packed as
  (N, D) rows; attention lays them out (B, S) again, the closed tokens zero and hidden as keys.
  A closed token's outputs never reach a decoder output (its key is closed to every query), so
  the memory there is left zero. A batch of sources of many lengths encodes its tokens, not
  B·S: at batch 32, one source of each length 1..32 is half the work.

A source with no open key (its mask all False, for a head or all): fused opens every key to its
query and zeroes the query, so every score is 0 and the softmax uniform. Here that source's
keys are zeroed once, when the cache starts: every score is again exactly 0.

Eval only: the step and the encoder have no dropout, and refuse a model in training mode. On
int8 linears, which quantize each call's input over the whole call, packing changes what the
encoder's products round: the padding's activations no longer count in an input's range.
Eager only: the step reads its position on the host (to slice the written slots), which a
compiled step must not.

Shape legend:
    R  rows (B sources x k beams)   B  sources   S  source length   D  model dim (d_model)
    H  heads   Dh  head dim (D / H)   max_len  the cache's positions   t  the step's position
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common import checks
from common.activations import activation
from common.cache import batch_first
from seq2seq.fast.onednn import SERVED

# what the flat encoder and step call: the model's and each layer's modules (fused's names)
MODEL_MODULES = ("src_embed", "tgt_embed", "encoder.norm", "decoder.norm", "generator")
ENCODER_LAYER_MODULES = ("self_attn.qkv_proj", "self_attn.out_proj", "feed_forward.linear1",
                         "feed_forward.linear2", "norm1", "norm2")
LAYER_MODULES = (*ENCODER_LAYER_MODULES, "cross_attn.q_proj", "cross_attn.kv_proj", "cross_attn.out_proj",
                 "norm3")


@dataclass
class FlatCache:
    """What a flat step reads besides its new ids: per decoder layer, the self-attention keys and
    values of ``R`` rows and the cross-attention's once per source, heads first; the additive
    masks over both."""

    model: weakref.ref  # the FlatDecoding that started it
    keys: list[Tensor]  # per layer (R, H, max_len, Dh): slot t holds position t's keys
    values: list[Tensor]  # per layer (R, H, max_len, Dh)
    cross_keys: list[Tensor]  # per layer (B, H, S, Dh): zero for a source (and head) with no open key
    cross_values: list[Tensor]  # per layer (B, H, S, Dh)
    self_bias: Tensor  # (R, 1, 1, max_len): 0 at a written slot whose id is not padding, -inf elsewhere
    src_bias: Tensor  # (B, 1 or H, 1, S): 0 where a source key is open (every key, for no open key), -inf
    # beam search's second buffer of each layer's keys and values, made at its first reorder
    spare_keys: list[Tensor] = field(default_factory=list)
    spare_values: list[Tensor] = field(default_factory=list)
    # a reorder some layers have not made yet: (origin (R,), the slots it moves, those layers)
    pending: tuple[Tensor, slice, set[int]] | None = None

    @property
    def batch_size(self) -> int:
        return self.self_bias.shape[0]

    @property
    def max_len(self) -> int:
        return self.self_bias.shape[-1]

    @property
    def dtype(self) -> torch.dtype:
        return self.self_bias.dtype

    def reorder_beams(self, origin: Tensor, written: int | None = None) -> None:
        """Row i continues old row ``origin[i]`` (R,) in the first ``written`` slots (None: every
        slot); the cross-attention's, one row per source, stay. The self-attention's mask moves
        now, each layer's keys and values when a step next reads them (``layer``), so that the
        step's attention reads them fresh from the gather. A layer's keys (and values) are
        gathered into a second buffer of their shape, which becomes the cache's, the old one the
        spare: one pass over the written slots, not a gather and a copy back. The slots after
        ``written`` are stale there until the next step writes them; no step reads a slot before
        writing it."""
        self.settle()  # a reorder before it is made in every layer
        slots = slice(None) if written is None else slice(0, written)
        self.self_bias[..., slots] = self.self_bias[..., slots].index_select(0, origin)  # (R, 1, 1, written)
        if not self.spare_keys:
            self.spare_keys = [torch.zeros_like(keys) for keys in self.keys]  # finite: 0 x NaN is not 0
            self.spare_values = [torch.zeros_like(values) for values in self.values]
        self.pending = (origin.clone(), slots, set(range(len(self.keys))))  # origin: the caller's to refill

    def layer(self, index: int) -> tuple[Tensor, Tensor]:
        """Decoder layer ``index``'s keys and values, (R, H, max_len, Dh) each, after the
        reorder this layer has not made yet, if any."""
        if self.pending is not None and index in self.pending[2]:
            origin, slots, layers = self.pending
            for buffers, spares in ((self.keys, self.spare_keys), (self.values, self.spare_values)):
                torch.index_select(buffers[index][:, :, slots], 0, origin,
                                   out=spares[index][:, :, slots])  # (R, H, written, Dh)
                buffers[index], spares[index] = spares[index], buffers[index]
            layers.remove(index)
            if not layers:
                self.pending = None
        return self.keys[index], self.values[index]

    def settle(self) -> None:
        """Makes a pending reorder in every layer that has not made it yet."""
        for index in range(len(self.keys)):
            self.layer(index)

    def window(self, length: int) -> FlatCache:
        """This cache itself: a flat step reads only the slots up to its position, whatever the
        window (``StaticNextToken`` asks an eager step's cache for one)."""
        if not 1 <= checks.check_int("length", length) <= self.max_len:
            raise ValueError(f"a window's length must lie in [1, max_len={self.max_len}], got {length}")
        return self


class FlatDecoding(nn.Module):
    """fused's ``project`` and ``generator`` beside a flat ``encode``, ``start_static_cache`` and
    ``static_step`` (module docstring): what ``StaticNextToken(..., flat=True)`` steps on."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if problem := flat_problem(model):
            raise ValueError(f"a flat step serves {SERVED}: {type(model).__module__}."
                             f"{type(model).__qualname__} {problem}")
        self.model = model
        self.config = model.config
        self.generator = model.generator
        self.activation = activation(model.config)  # the feed-forward's, as fused's (a function)
        # ReLU inside the first linear's product where every such linear offers it (the int8 and
        # oneDNN copies' ``relu``): one pass over the hidden layer fewer
        self.relu_in_product = model.config.activation == "relu" and all(
            callable(getattr(layer.feed_forward.linear1, "relu", None))
            for layer in (*model.encoder.layers, *model.decoder.layers))
        self.heads = model.config.n_heads
        self.scale = 1 / math.sqrt(model.config.d_model // model.config.n_heads)  # 1 / sqrt(Dh)
        self.train(model.training)  # the model's mode, not a fresh module's (training)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """(B, S) source ids -> (B, S, D) memory: fused's encoder on the open tokens alone where
        ``src_mask`` is a key mask that closes some (``open_tokens``), zeros at the closed ones;
        otherwise the model's ``encode``. Every product but attention's runs on the N open
        tokens, (N, D), not on B·S."""
        checks.check_source(self.model, src, src_mask)
        keep = open_tokens(src_mask, src.shape)  # (B, S) or None
        if keep is None:
            return self.model.encode(src, src_mask)  # (B, S, D)
        if self.training:
            raise RuntimeError("a flat encoder has no dropout: call it in eval mode (model.eval())")
        x = self.model.src_embed(src) * math.sqrt(self.config.d_model)  # (B, S, D)
        x = (x + self.model.pe[: src.shape[1]].to(x.dtype))[keep]  # (N, D): E[ids] * sqrt(D) + PE, open only
        bias = additive(keep, x.dtype)[:, None, None, :]  # (B, 1, 1, S): every source has an open key
        for layer in self.model.encoder.layers:
            x = self.encoder_layer(layer, x, keep, bias)
        memory = x.new_zeros(*keep.shape, self.config.d_model)  # (B, S, D)
        memory[keep] = self.model.encoder.norm(x)
        return memory

    def encoder_layer(self, layer: nn.Module, x: Tensor, keep: Tensor, bias: Tensor) -> Tensor:
        """One encoder layer on the (N, D) open tokens: self-attention, then feed-forward, each
        with its residual and norm (post- or pre-norm)."""
        if layer.norm_first:
            x = x + self.packed_self_attention(layer.self_attn, layer.norm1(x), keep, bias)
            return x + self.feed_forward(layer.feed_forward, layer.norm2(x))
        x = layer.norm1(x + self.packed_self_attention(layer.self_attn, x, keep, bias))
        return layer.norm2(x + self.feed_forward(layer.feed_forward, x))  # (N, D)

    def packed_self_attention(self, attention: nn.Module, x: Tensor, keep: Tensor, bias: Tensor) -> Tensor:
        """Self-attention of the (N, D) open tokens over each other, source by source: projected
        as N rows, laid out (B, S) for the attention (zeros at the closed tokens, which ``bias``
        hides as keys and whose outputs are dropped), packed again for ``out_proj``."""
        batch, src_len = keep.shape
        qkv = x.new_zeros(batch, src_len, 3 * self.config.d_model)  # (B, S, 3D)
        qkv[keep] = attention.qkv_proj(x)
        q, k, v = qkv.unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, S, Dh)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # (B, H, S, Dh)
        return attention.out_proj(out.transpose(1, 2).flatten(2)[keep])  # (N, D)

    def project(self, hidden: Tensor) -> Tensor:
        return self.model.project(hidden)  # (R, 1, V)

    def start_static_cache(self, memory: Tensor, src_mask: Tensor | None, max_len: int,
                           out: FlatCache | None = None, *, beams: int = 1) -> FlatCache:
        """(B, S, D) memory and its key mask -> a ``FlatCache`` of ``max_len`` positions and
        B·``beams`` rows (row i·beams + j the j-th of source i). ``out`` is accepted for
        ``start_static_cache``'s signature and not reused: nothing keeps a flat cache's addresses."""
        checks.check_start(self.model, memory, src_mask)
        if not 1 <= checks.check_int("max_len", max_len) <= self.config.max_seq_len:
            raise ValueError(f"max_len must lie in [1, max_seq_len={self.config.max_seq_len}], got {max_len}")
        checks.check_int("beams", beams, low=1)
        batch, src_len, _ = memory.shape
        rows, head_dim = batch * beams, self.config.d_model // self.heads
        if src_mask is None:
            src_mask = memory.new_ones(batch, 1, 1, src_len, dtype=torch.bool)
        src_mask = batch_first(src_mask, batch).expand(-1, -1, 1, src_len)  # (B, 1 or H, 1, S)
        no_key = ~src_mask.any(dim=-1, keepdim=True)  # (B, 1 or H, 1, 1)
        src_bias = additive(src_mask | no_key, memory.dtype)  # (B, 1 or H, 1, S)
        cross_keys, cross_values = [], []
        for keys, values in self.cross_keys_values(memory, open_tokens(src_mask, (batch, src_len))):
            keys = keys.unflatten(-1, (self.heads, head_dim)).transpose(1, 2)  # (B, H, S, Dh)
            cross_keys.append(keys.masked_fill(no_key, 0.0).contiguous())  # every score 0 without a key
            cross_values.append(values.unflatten(-1, (self.heads, head_dim)).transpose(1, 2)
                                .contiguous())  # (B, H, S, Dh)
        shape = (rows, self.heads, max_len, head_dim)
        # finite (0 x NaN is not 0); each layer's keys, then its values
        zeros = [[memory.new_zeros(shape) for _ in cross_keys] for _ in range(2)]
        self_bias = torch.full((rows, 1, 1, max_len), -math.inf, dtype=memory.dtype, device=memory.device)
        return FlatCache(weakref.ref(self), *zeros, cross_keys, cross_values, self_bias, src_bias)

    def cross_keys_values(self, memory: Tensor, keep: Tensor | None) -> list[tuple[Tensor, Tensor]]:
        """Each decoder layer's cross-attention keys and values of (B, S, D) memory, (B, S, D)
        each: projected at the ``keep`` (B, S) tokens alone and zero at the others (closed to
        every query), or at every token (None)."""
        if keep is None:
            starts = self.model.decoder.start_cache(memory)
            return [(layer.cross_keys, layer.cross_values) for layer in starts]
        open_memory = memory[keep]  # (N, D)
        pairs = []
        for layer in self.model.decoder.layers:
            keys_values = memory.new_zeros(*keep.shape, 2 * self.config.d_model)  # (B, S, 2D)
            keys_values[keep] = layer.cross_attn.kv_proj(open_memory)
            pairs.append(keys_values.split(self.config.d_model, dim=-1))
        return pairs

    def static_step(self, tgt: Tensor, position: Tensor, cache: FlatCache) -> Tensor:
        """(R, 1) ids at ``position`` (0-d int64) -> (R, 1, D), as fused's ``static_step``: writes
        the position's keys, values and mask slot into ``cache`` and attends over the slots up to
        it."""
        if self.training:
            raise RuntimeError("a flat step has no dropout: call it in eval mode (model.eval())")
        if not isinstance(cache, FlatCache) or cache.model() is not self:
            raise TypeError(f"cache must be a FlatCache this FlatDecoding started, "
                            f"got {type(cache).__name__}")
        checks.check_static_step(self.model, tgt, position, cache.batch_size, cache.max_len)
        t = int(position)  # host read: the slots 0..t this step attends over
        real = (tgt != self.config.pad_id) | (t == 0)  # (R, 1): BOS at position 0 is never padding
        cache.self_bias[:, 0, :, t] = torch.zeros_like(real, dtype=cache.dtype).masked_fill_(~real, -math.inf)
        x = self.model.tgt_embed(tgt) * math.sqrt(self.config.d_model)  # (R, 1, D)
        x = x + self.model.pe[t].to(x.dtype)  # E[ids] * sqrt(D) + PE[t]
        self_bias = cache.self_bias[..., : t + 1]  # (R, 1, 1, t + 1)
        for index, (layer, cross_keys, cross_values) in enumerate(
                zip(self.model.decoder.layers, cache.cross_keys, cache.cross_values, strict=True)):
            keys, values = cache.layer(index)  # moved here by a pending reorder: read while fresh
            x = self.layer_step(layer, x, t, keys, values, self_bias, cross_keys, cross_values,
                                cache.src_bias)
        return self.model.decoder.norm(x)  # (R, 1, D)

    def layer_step(self, layer: nn.Module, x: Tensor, t: int, keys: Tensor, values: Tensor, self_bias: Tensor,
                   cross_keys: Tensor, cross_values: Tensor, src_bias: Tensor) -> Tensor:
        """One decoder layer on (R, 1, D): self-attention, cross-attention, feed-forward, each
        with its residual and norm (post- or pre-norm)."""
        if layer.norm_first:
            x = x + self.self_attention(layer.self_attn, layer.norm1(x), t, keys, values, self_bias)
            x = x + self.cross_attention(layer.cross_attn, layer.norm2(x), cross_keys, cross_values, src_bias)
            return x + self.feed_forward(layer.feed_forward, layer.norm3(x))
        x = layer.norm1(x + self.self_attention(layer.self_attn, x, t, keys, values, self_bias))
        x = layer.norm2(x + self.cross_attention(layer.cross_attn, x, cross_keys, cross_values, src_bias))
        return layer.norm3(x + self.feed_forward(layer.feed_forward, x))  # (R, 1, D)

    def self_attention(self, attention: nn.Module, x: Tensor, t: int, keys: Tensor, values: Tensor,
                       bias: Tensor) -> Tensor:
        """Masked self-attention of (R, 1, D) over the slots 0..t, writing slot t first."""
        rows, _, d_model = x.shape
        q, k, v = attention.qkv_proj(x).view(rows, 3, self.heads, -1).unbind(1)  # 3 x (R, H, Dh)
        keys[:, :, t], values[:, :, t] = k, v  # slot t of (R, H, max_len, Dh)
        written_keys = keys[:, :, : t + 1].transpose(-1, -2)  # (R, H, Dh, t + 1): K^T, a view
        scores = torch.matmul(q.unsqueeze(2), written_keys).mul_(self.scale).add_(bias)  # (R, H, 1, t + 1)
        x = torch.matmul(scores.softmax(dim=-1), values[:, :, : t + 1])  # (R, H, 1, Dh)
        return attention.out_proj(x.view(rows, 1, d_model))  # (R, 1, D): heads merged (one query)

    def cross_attention(self, attention: nn.Module, x: Tensor, keys: Tensor, values: Tensor,
                        bias: Tensor) -> Tensor:
        """Cross-attention of (R, 1, D), R = B·k, over the sources' keys (B, H, S, Dh): a source's
        k rows are k queries of it."""
        rows, _, d_model = x.shape
        sources = keys.shape[0]
        q = attention.q_proj(x).view(sources, rows // sources, self.heads, -1)  # (B, k, H, Dh)
        q = q.transpose(1, 2)  # (B, H, k, Dh)
        scores = torch.matmul(q, keys.transpose(-1, -2)).mul_(self.scale).add_(bias)  # (B, H, k, S)
        x = torch.matmul(scores.softmax(dim=-1), values).transpose(1, 2)  # (B, k, H, Dh)
        return attention.out_proj(x.reshape(rows, 1, d_model))  # (R, 1, D)

    def feed_forward(self, feed_forward: nn.Module, x: Tensor) -> Tensor:
        if self.relu_in_product:
            return feed_forward.linear2(feed_forward.linear1.relu(x))  # (R, 1, D)
        return feed_forward.linear2(self.activation(feed_forward.linear1(x)))


def flat_problem(model: nn.Module) -> str | None:
    """Why ``model`` has no fused encoder and decoder for the flat path to walk (as words after
    its class name), or None."""
    stacks = {stack: getattr(getattr(model, stack, None), "layers", None) for stack in ("encoder", "decoder")}
    empty = [stack for stack, layers in stacks.items() if not isinstance(layers, nn.ModuleList) or not layers]
    if empty:
        return f"has no {' and no '.join(empty)} layers ({', '.join(f'{stack}.layers' for stack in empty)})"
    missing = [name for name in MODEL_MODULES if not has_module(model, name)]
    for stack, needed in (("encoder", ENCODER_LAYER_MODULES), ("decoder", LAYER_MODULES)):
        missing += [f"{stack}.layers.0.{name}" for name in needed if not has_module(stacks[stack][0], name)]
    return f"has no {', '.join(missing)}" if missing else None


def has_module(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


def additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool mask (True = may attend) as the bias added to the scores: 0 there, -inf elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, -math.inf)


def open_tokens(src_mask: Tensor | None, shape: tuple[int, int]) -> Tensor | None:
    """(B, S) True at the tokens a key mask leaves open, where skipping the others changes no
    decoder output: ``src_mask`` one key mask for every head and query, (B or 1, 1, 1, S) after
    ``batch_first``, that closes some token and leaves every source one open (a source with none
    attends uniformly to every key, closed ones included). None otherwise: no mask, per-head or
    per-query masks, nothing closed, or a source with no open key."""
    if src_mask is None:
        return None
    mask = batch_first(src_mask, shape[0])  # (B, 1 or H, 1 or S, S)
    if mask.shape[1:3] != (1, 1):
        return None
    keep = mask[:, 0, 0, :].expand(shape)  # (B, S)
    if keep.all() or not keep.any(dim=1).all():
        return None
    return keep
