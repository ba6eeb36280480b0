"""Greedy decoding (``greedy_decode``) through the interface every variant shares, with a
key/value cache where the model has one; the next-token step it shares with beam search
(``NextToken``), the argument checks both run (``check_arguments``) and the eval mode both
decode in (``eval_mode``).

    tokens = greedy_decode(model.eval(), src, padding_mask(src, pad_id),
                           max_len=20, bos_id=1, eos_id=2)  # (B, L), L <= 20

The source is encoded once. The target starts as BOS and grows by one token per step: the
generator's most likely next token is appended. A sequence that has produced EOS is finished;
it is extended with padding from then on, and the loop ends as soon as every sequence in the
batch is finished (or ``max_len`` is reached).

``NextToken`` gives each step its log-probabilities. With a key/value cache (``model.has_cache``,
every from-scratch variant) a step decodes the newest token only, ``decode_step``, reading the
keys and values of the earlier ones from the cache. Without one (the torch reference, or
``use_cache=False``) a step decodes the whole prefix under the usual causal and padding mask —
about L²/2 decoder positions for L tokens instead of L, the cross-attention keys and values
recomputed every step — and that is the specification the cache is tested against.
``seq2seq.decoding.beam`` steps with it too.

Shape legend:
    B  batch (or batch x beams)   S  source length   L  generated length (BOS included)
    D  model dim                  V  target vocabulary
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from common.cache import batch_first
from common.checks import check_int
from common.config import TransformerConfig
from common.masks import decoder_mask


class NextToken:
    """Next-token log-probabilities of a batch of prefixes that grow by one token per call.

    Encodes the source once; with ``use_cache`` and a model that has a cache, starts it. Called
    with the prefixes (B, L) — each call's one token longer than the last's — it returns the
    (B, V) log-probabilities of the token after each: from the cache, one position decoded, or
    by decoding the whole prefix again. ``reorder`` makes row i continue old row ``origin[i]``.
    """

    def __init__(self, model: nn.Module, src: Tensor, src_mask: Tensor | None, use_cache: bool) -> None:
        self.model = model
        self.memory = model.encode(src, src_mask)  # (B, S, D); encode checks src and src_mask
        self.src_mask = None if src_mask is None else batch_first(src_mask, src.shape[0])
        cached = use_cache and getattr(model, "has_cache", False)
        self.cache = model.start_cache(self.memory, src_mask) if cached else None

    def __call__(self, tokens: Tensor) -> Tensor:
        if self.cache is not None:  # the earlier positions' keys and values are the cache's
            hidden = self.model.decode_step(tokens[:, -1:], self.cache)  # (B, 1, D)
        else:
            tgt_mask = decoder_mask(tokens, self.model.config.pad_id)  # (B, 1, L, L)
            hidden = self.model.decode(tokens, self.memory, self.src_mask, tgt_mask)[:, -1:]  # (B, 1, D)
        return self.model.project(hidden)[:, -1]  # (B, V)

    def reorder(self, origin: Tensor) -> None:
        """Row i continues old row ``origin[i]`` (B',): the cache's rows, or the source's."""
        if self.cache is not None:
            self.cache.reorder(origin)
            return
        self.memory = self.memory.index_select(0, origin)  # (B', S, D)
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, origin)  # (B', 1, 1, S)


@torch.no_grad()
def greedy_decode(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor | None = None,
    *,
    max_len: int,
    bos_id: int,
    eos_id: int,
    use_cache: bool = True,
) -> Tensor:
    """Most likely token at each step, batched: (B, S) source ids -> (B, L) target ids.

    Every row starts with ``bos_id``; after a row's ``eos_id`` it holds ``config.pad_id``.
    ``L <= max_len`` counts BOS; L is shorter when every row has reached EOS earlier: EOS
    chosen at the first step everywhere gives (B, 2) rows of BOS, EOS. ``max_len=1`` gives the
    BOS column alone; ``max_len`` has no default (None is a ``TypeError``).
    ``src_mask`` masks source keys, e.g. ``padding_mask(src, pad_id)`` of shape (B, 1, 1, S);
    ``None`` attends everywhere, as in ``encode``. ``use_cache=False`` decodes by full recompute
    even where the model has a cache (the tokens are the same). Decodes in eval mode, without
    dropout, whatever mode the model is in: a model in train mode is switched to eval for the
    call, and each module's own mode is given back afterwards, after an exception too
    (``eval_mode``).
    """
    config = check_arguments(model, src_mask, max_len, bos_id, eos_id, use_cache, max_len_may_be_none=False)
    check_no_empty_source(src, src_mask)
    pad_id = config.pad_id
    with eval_mode(model):
        next_token_logp = NextToken(model, src, src_mask, use_cache)
        batch = src.shape[0]
        tokens = torch.full((batch, 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
        finished = torch.zeros(batch, dtype=torch.bool, device=src.device)  # (B,)
        # One step per generated position: each step needs the token the previous one chose.
        for _ in range(max_len - 1):
            next_token = next_token_logp(tokens).argmax(dim=-1)  # (B,)
            next_token = next_token.masked_fill(finished, pad_id)  # finished rows only pad
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (B, L + 1)
            finished |= next_token == eos_id
            if finished.all():
                break
    return tokens


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode inside the block (no dropout); after it, each of its modules is in
    the mode it was in before (a caller's mix of train and eval included), after an exception too."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def check_no_empty_source(src: object, src_mask: object) -> None:
    """Refuse a source row whose mask hides every position (a padding-only row): it has nothing
    to translate, and the variants' attention over no keys is not defined alike (NaN, or one row
    of padding ids and -inf scores). A ``ValueError`` naming the row; a mask that does not fit
    ``src`` is left to ``encode``'s checks, and so is one on another device than ``src`` or
    on the meta device (no values to read: ``encode`` names the device)."""
    if not (isinstance(src, Tensor) and src.ndim == 2 and isinstance(src_mask, Tensor)
            and src_mask.dtype == torch.bool and src_mask.ndim <= 4 and src.shape[0] > 0
            and src_mask.device == src.device and src_mask.device.type != "meta"):
        return
    try:
        keys = torch.broadcast_to(src_mask, (*((1,) * (4 - src_mask.ndim)), *src_mask.shape))
        keys = torch.broadcast_to(keys, (src.shape[0], keys.shape[1], keys.shape[2], src.shape[1]))
    except RuntimeError:
        return
    empty = (~keys.any(dim=-1)).flatten(1).any(dim=1)  # (B,): some query of the row sees no key
    if bool(empty.any()):
        row = int(empty.nonzero()[0, 0])
        raise ValueError(f"src_mask hides every position of source row {row} (a padding-only "
                         "source): there is nothing to decode; leave such rows out")


def check_arguments(
    model: object, src_mask: object, max_len: object, bos_id: object, eos_id: object,
    use_cache: object, *, max_len_may_be_none: bool = True,
) -> TransformerConfig:
    """Everything ``encode`` does not check itself; raises before any tensor work. ``max_len``
    None is beam search's default (a length from each source); greedy decoding has none, and
    refuses it (``max_len_may_be_none=False``)."""
    if not isinstance(model, nn.Module) or not all(
        callable(getattr(model, method, None)) for method in ("encode", "decode", "project")
    ):
        raise TypeError(
            "model must be an nn.Module with encode, decode and project (see variants.build), "
            f"got {type(model).__name__}"
        )
    config = getattr(model, "config", None)
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"model.config must be a TransformerConfig, got {type(config).__name__}")
    if not isinstance(use_cache, bool):
        raise TypeError(f"use_cache must be a bool, got {type(use_cache).__name__} {use_cache!r}")
    if max_len is None and not max_len_may_be_none:
        raise TypeError("max_len must be an int, the longest output counting BOS, in "
                        f"[1, max_seq_len={config.max_seq_len}]; greedy decoding has no default, got None")
    lengths = [] if max_len is None else [("max_len", max_len)]
    for name, value in (*lengths, ("bos_id", bos_id), ("eos_id", eos_id)):
        check_int(name, value)
    if max_len is not None and not 1 <= max_len <= config.max_seq_len:
        raise ValueError(
            f"max_len must lie in [1, max_seq_len={config.max_seq_len}] (it counts BOS), "
            f"got {max_len}"
        )
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        if not 0 <= value < config.tgt_vocab_size:
            raise ValueError(
                f"{name} must lie in [0, tgt_vocab_size={config.tgt_vocab_size}), got {value}"
            )
        if value == config.pad_id:
            # BOS as padding would mask the only key of the first step; EOS as padding could
            # not be told apart from the padding that follows it.
            raise ValueError(f"{name} must differ from config.pad_id ({config.pad_id}), got {value}")
    if bos_id == eos_id:
        raise ValueError(f"bos_id and eos_id must differ, both are {bos_id}")
    if isinstance(src_mask, Tensor) and src_mask.ndim >= 2 and src_mask.shape[-2] != 1:
        # the same mask serves encoder self-attention (S queries) and cross-attention (L queries)
        raise ValueError(
            "src_mask must mask source keys only, with a query dimension of 1, e.g. "
            f"padding_mask(src, pad_id) of shape (B, 1, 1, S); got shape {tuple(src_mask.shape)}"
        )
    return config
