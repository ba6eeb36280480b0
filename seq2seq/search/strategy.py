"""What every search shares (OpenNMT-py's ``decode_strategy`` idea): the cached next-token step
(``NextToken``), the ids a search never picks (``ban_mask``, ``apply_ban``), the eval mode a
search decodes in (``eval_mode``) and the checks of its arguments (``check_arguments``,
``check_beam_arguments``, ``check_source``, ``check_no_empty_source``). Greedy decoding and
beam search (``seq2seq.search.greedy``, ``.beam``) use them, and so does the fast path
(``seq2seq.fast``); nothing here decodes a sequence by itself.

``NextToken`` gives each step its log-probabilities. With a key/value cache (``model.has_cache``,
every from-scratch variant) a step decodes the newest token only, ``decode_step``, reading the
keys and values of the earlier ones from the cache. Without one (the torch reference, or
``use_cache=False``) a step decodes the whole prefix under the usual causal and padding mask —
about L²/2 decoder positions for L tokens instead of L, the cross-attention keys and values
recomputed every step — and that is the specification the cache is tested against.

Banned ids are a decoding constraint, not part of the model's function: a model file carries
them (``ModelFile.banned_ids``: a converted opus-mt model's padding id, which is also its
decoder's start), and every search masks their log-probabilities to -inf before it chooses,
here in one place (``apply_ban``), without renormalising the rest, as Hugging Face's
``generate`` does (its ``NoBadWordsLogitsProcessor``): greedy decoding's argmax and beam
search's scores are then ``generate``'s.

The checks raise before any tensor work, in one line naming the argument. ``check_arguments``
and ``check_beam_arguments`` read what a search is given once (the model, lengths, special ids,
beam size, alpha; ``check_start_id`` the start id against ``config.decoder_start``);
``check_source`` what each call brings (the source and its mask), so that a decoder built ahead
checks the first at construction and only the second per call.

Shape legend:
    B  batch (or batch x beams)   S  source length   L  generated length (BOS included)
    D  model dim                  V  target vocabulary
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn

from common.cache import batch_first
from common.checks import check_int, check_number
from common.config import TransformerConfig
from common.masks import decoder_mask


def ban_mask(banned_ids: Sequence[int], vocab_size: int, device: torch.device | str) -> Tensor | None:
    """(V,) True at each banned id, or None where nothing is banned (the ids are checked:
    ``check_banned_ids``)."""
    if not banned_ids:
        return None
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)  # (V,)
    mask[list(banned_ids)] = True
    return mask


def apply_ban(scores: Tensor, mask: Tensor | None) -> Tensor:
    """(..., V) log-probabilities or logits with each banned id's entry -inf (``mask`` from
    ``ban_mask``; None: unchanged). The others are left as they are, not renormalised: the
    search chooses among them, as ``generate`` does after its bad-words processor."""
    return scores if mask is None else scores.masked_fill(mask, -math.inf)


class NextToken:
    """Next-token log-probabilities of a batch of prefixes that grow by one token per call.

    Encodes the source once; with ``use_cache`` and a model that has a cache, starts it. Called
    with the prefixes (B, L) — each call's one token longer than the last's — it returns the
    (B, V) log-probabilities of the token after each: from the cache, one position decoded, or
    by decoding the whole prefix again; each of ``banned_ids`` is -inf (``apply_ban``).
    ``reorder`` makes row i continue old row ``origin[i]``.
    """

    def __init__(self, model: nn.Module, src: Tensor, src_mask: Tensor | None, use_cache: bool,
                 banned_ids: Sequence[int] = ()) -> None:
        self.model = model
        self.memory = model.encode(src, src_mask)  # (B, S, D); encode checks src and src_mask
        self.src_mask = None if src_mask is None else batch_first(src_mask, src.shape[0])
        cached = use_cache and getattr(model, "has_cache", False)
        self.cache = model.start_cache(self.memory, src_mask) if cached else None
        self.ban = ban_mask(banned_ids, model.config.tgt_vocab_size, src.device)  # (V,) or None

    def __call__(self, tokens: Tensor) -> Tensor:
        if self.cache is not None:  # the earlier positions' keys and values are the cache's
            hidden = self.model.decode_step(tokens[:, -1:], self.cache)  # (B, 1, D)
        else:
            tgt_mask = decoder_mask(tokens, self.model.config.pad_id)  # (B, 1, L, L)
            hidden = self.model.decode(tokens, self.memory, self.src_mask, tgt_mask)[:, -1:]  # (B, 1, D)
        return apply_ban(self.model.project(hidden)[:, -1], self.ban)  # (B, V)

    def reorder(self, origin: Tensor) -> None:
        """Row i continues old row ``origin[i]`` (B',): the cache's rows, or the source's."""
        if self.cache is not None:
            self.cache.reorder(origin)
            return
        self.memory = self.memory.index_select(0, origin)  # (B', S, D)
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, origin)  # (B', 1, 1, S)


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
    use_cache: object, *, max_len_may_be_none: bool = True, banned_ids: object = (),
) -> TransformerConfig:
    """Everything ``encode`` does not check itself; raises before any tensor work. ``max_len``
    None is beam search's default (a length from each source); greedy decoding has none, and
    refuses it (``max_len_may_be_none=False``). ``banned_ids``: ``check_banned_ids``."""
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
    if eos_id == config.pad_id:  # EOS as padding could not be told from the padding after it
        raise ValueError(f"eos_id must differ from config.pad_id ({config.pad_id}), got {eos_id}")
    check_start_id(config, bos_id, eos_id)
    check_banned_ids(banned_ids, config, eos_id)
    check_source_mask(src_mask)
    return config


def check_banned_ids(banned_ids: object, config: TransformerConfig, eos_id: int) -> None:
    """The ids a search never picks: a tuple or list of ints in [0, tgt_vocab_size), EOS not
    among them (a search that cannot end would run to its length limit on every row)."""
    if not isinstance(banned_ids, (tuple, list)):
        raise TypeError(f"banned_ids must be a tuple of ints, got {type(banned_ids).__name__} {banned_ids!r}")
    for value in banned_ids:
        check_int("banned_ids", value)
        if not 0 <= value < config.tgt_vocab_size:
            raise ValueError(f"banned_ids must lie in [0, tgt_vocab_size={config.tgt_vocab_size}), "
                             f"got {value}")
    if eos_id in banned_ids:
        raise ValueError(f"banned_ids holds eos_id ({eos_id}): a search that may not end cannot stop")


def check_start_id(config: TransformerConfig, bos_id: int, eos_id: int) -> None:
    """The decoder's first id as ``config.decoder_start`` says: a BOS of its own ("bos", unlike
    padding and EOS), or the padding id ("pad", Marian), or EOS ("eos", fairseq). The start
    token is a key whatever its id (``common.masks.target_padding_mask``), and a search reads
    EOS only among the ids it generates, so a start equal to either is safe where the model was
    trained so; anywhere else it is a mistake, refused."""
    if config.decoder_start == "pad" and bos_id != config.pad_id:
        raise ValueError(f"config.decoder_start is 'pad': the decoder starts with pad_id, so bos_id "
                         f"must be {config.pad_id}, got {bos_id}")
    if config.decoder_start == "eos" and bos_id != eos_id:
        raise ValueError(f"config.decoder_start is 'eos': the decoder starts with EOS, so bos_id "
                         f"must equal eos_id ({eos_id}), got {bos_id}")
    if config.decoder_start == "bos" and bos_id == config.pad_id:
        # a start as padding would be a model trained so: config.decoder_start='pad' says it
        raise ValueError(f"bos_id must differ from config.pad_id ({config.pad_id}), got {bos_id} "
                         "(a decoder that starts with the padding id has config.decoder_start='pad')")
    if config.decoder_start == "bos" and bos_id == eos_id:
        raise ValueError(f"bos_id and eos_id must differ, both are {bos_id} "
                         "(a decoder that starts with EOS has config.decoder_start='eos')")


def check_source_mask(src_mask: object) -> None:
    """A source mask masks keys only: its query dimension is 1, since the same mask serves encoder
    self-attention (S queries) and cross-attention (L queries). Its other checks are ``encode``'s."""
    if isinstance(src_mask, Tensor) and src_mask.ndim >= 2 and src_mask.shape[-2] != 1:
        raise ValueError(
            "src_mask must mask source keys only, with a query dimension of 1, e.g. "
            f"padding_mask(src, pad_id) of shape (B, 1, 1, S); got shape {tuple(src_mask.shape)}"
        )


def check_source(src: object, src_mask: object) -> None:
    """What a call of a decoder built ahead brings, checked before any tensor work: a mask of
    source keys only and no padding-only source row (``encode`` checks the rest). The fixed-shape
    decoders (``seq2seq.fast``) check their settings once when built, and this at every call."""
    check_source_mask(src_mask)
    check_no_empty_source(src, src_mask)


def check_beam_arguments(model: object, src: object, src_mask: object, max_len: object, bos_id: object,
                         eos_id: object, use_cache: object, beam_size: object, alpha: object, *,
                         max_len_may_be_none: bool = True, banned_ids: object = ()) -> TransformerConfig:
    """``beam_search``'s arguments, before any tensor work: greedy decoding's checks, a beam of at
    least one, a non-negative alpha and no padding-only source. A static cache needs its
    ``max_len`` (``max_len_may_be_none=False``)."""
    config = check_arguments(model, src_mask, max_len, bos_id, eos_id, use_cache,
                             max_len_may_be_none=max_len_may_be_none, banned_ids=banned_ids)
    check_int("beam_size", beam_size, low=1)
    check_number("alpha", alpha, low_closed=True)  # a negative alpha would favour short output
    check_no_empty_source(src, src_mask)
    return config
