"""Greedy decoding and beam search on a static-shape cached step, compiled: the same tokens as
``seq2seq.search.greedy.greedy_decode`` and the same hypotheses as
``seq2seq.search.beam.beam_search``.

    decode = StaticGreedy(model.eval(), max_len=20, bos_id=1, eos_id=2,
                          onednn=True)          # CPU float32; on CUDA compile_mode="reduce-overhead"
    tokens = decode(src, padding_mask(src, pad_id))       # (B, L), L <= 20
    best = StaticBeam(model.eval(), max_len=20, bos_id=1, eos_id=2,
                      onednn=True)(src, padding_mask(src, pad_id))  # Hypotheses

The model must have a static step (``start_static_cache`` and ``static_step``: ``variants.fused``).
Its cache holds ``max_len`` positions from the start; every step has the same shapes: the last
id (B, 1) and the position, a 0-d tensor, are buffers this loop refills in place, and what the
search needs of a step runs inside the compiled function: greedy decoding's argmax over the
generator's logits (the log-softmax keeps their order, so the ids are the same), beam search's
log-probabilities after moving each beam's cache rows (``reorder_beams``). The only host read
per step is the loop's own stopping test, outside the step. A decoder keeps its cache between
calls and refills it for a batch of the same shape, so a compiled step meets the same buffers
again instead of compiling anew. Beam search's cache holds the encoder output's keys and values
once per source, not once per beam (``start_static_cache(..., beams=k)``).

``compile_mode`` None runs the step eagerly, on the cache's window of the positions written so
far (``StaticCache.window``: the same buffers, so a step reads t slots, not ``max_len``);
otherwise it is ``torch.compile``'s mode, with ``freezing`` inductor's freezing on top: the
weights become constants of the compiled graph, on CPU packed for the step's matrix products
(the cache is then not marked as of static address, which freezing would fold in too).
``onednn`` (CPU float32) decodes on a copy whose linears (encoder, decoder, generator) run
oneDNN's product on weights packed once (``seq2seq.fast.onednn``), in ``onednn_dtype``
(float32, or bfloat16: half the bytes a step streams): build a new decoder after changing the
model's weights. ``flat`` (eager only) steps through ``seq2seq.fast.flat.FlatDecoding``: the
same step written as one function over the decoder's weights, keys and values kept heads
first, attention by two matrix products instead of SDPA.

A decoder checks its settings once, when built (the model, ``max_len``, the special ids, the
beam, the compile options: ``check_arguments``, ``check_beam_arguments``), and at each call only
what the call brings, the source and its mask (``check_source``). Each call decodes in eval mode,
as ``greedy_decode`` and ``beam_search`` do: the model it steps (the packed copy, with
``onednn``) is switched to eval for the call, without dropout, and each of its modules is given
its own mode back afterwards, after an exception too (``eval_mode``). An eager call runs in
inference mode and a compiled one under no_grad (``StaticNextToken.decoding``); what it hands
back is an ordinary tensor either way.

Shape legend:
    B  batch (beam search: sources x beams)   S  source length
    L  generated length (BOS included)         V  target vocabulary
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch import Tensor, nn

from common.cache import batch_first
from common.checks import ids_range_checked
from seq2seq.fast import blocks
from seq2seq.fast.flat import FlatDecoding
from seq2seq.fast.onednn import with_onednn_linears
from seq2seq.search.beam import ALPHA, BEAM_SIZE, Hypotheses, best_extensions, search
from seq2seq.search.strategy import (
    apply_ban,
    ban_mask,
    check_arguments,
    check_beam_arguments,
    check_source,
    eval_mode,
)

STATIC_METHODS = ("start_static_cache", "static_step")


def compiled(step: Callable, mode: str | None, freezing: bool) -> Callable:
    """``step`` itself (mode None), or compiled by inductor in ``mode``, frozen if asked."""
    if mode is None:
        return step
    options = dict(torch._inductor.list_mode_options(mode))  # what torch.compile(mode=...) sets
    if freezing:
        options["freezing"] = True
    return torch.compile(step, options=options)


class StaticNextToken:
    """``NextToken``'s static-shape twin over (B, L) prefixes, one ``static_step`` per call,
    compiled with ``compile_mode`` (and ``freezing``) unless the mode is None, its linears on
    oneDNN with ``onednn`` (``seq2seq.fast.onednn``): called, the (B, V)
    log-probabilities of the next token; ``next_ids``, its (B,) most likely ids; both with
    ``banned_ids`` masked inside the step (``seq2seq.search.strategy.apply_ban``). With
    ``reorders`` (beam search), ``reorder(origin)`` moves the cache's rows inside the next call."""

    def __init__(self, model: nn.Module, max_len: int, compile_mode: str | None = None, *,
                 freezing: bool = False, onednn: bool = False, onednn_dtype: torch.dtype = torch.float32,
                 reorders: bool = False, banned_ids: tuple[int, ...] = (), flat: bool = False) -> None:
        missing = [name for name in STATIC_METHODS if not callable(getattr(model, name, None))]
        if missing:
            raise TypeError(f"{type(model).__module__} has no static step ({', '.join(missing)} "
                            "missing): variants.fused has one")
        if compile_mode is not None and not isinstance(compile_mode, str):
            raise TypeError(f"compile_mode must be a torch.compile mode or None, got {compile_mode!r}")
        if not isinstance(freezing, bool):
            raise TypeError(f"freezing must be a bool, got {type(freezing).__name__} {freezing!r}")
        if freezing and compile_mode is None:
            raise ValueError("freezing is a compile option: give a compile_mode too")
        if not isinstance(onednn, bool):
            raise TypeError(f"onednn must be a bool, got {type(onednn).__name__} {onednn!r}")
        # inductor lowers oneDNN's linear only on weights it packed itself
        if onednn and compile_mode is not None:
            raise ValueError("onednn runs the step eagerly: give compile_mode None (inductor cannot compile "
                             "a linear on weights packed outside it)")
        if onednn_dtype != torch.float32 and not onednn:
            raise ValueError(f"onednn_dtype is the packed weights' dtype: give onednn=True too, got "
                             f"onednn_dtype={onednn_dtype}")
        if not isinstance(flat, bool):
            raise TypeError(f"flat must be a bool, got {type(flat).__name__} {flat!r}")
        if flat and compile_mode is not None:
            raise ValueError("flat runs the step eagerly (it reads its position on the host): give "
                             "compile_mode None")
        # a packed copy, or the model; walked by a flat step, or stepped by its own
        self.model = with_onednn_linears(model, onednn_dtype) if onednn else model
        if flat:
            self.model = FlatDecoding(self.model)
        self.max_len = max_len
        device = next(model.parameters()).device
        self.ban = ban_mask(banned_ids, model.config.tgt_vocab_size, device)  # (V,) or None
        # eager on the CPU, the next ids are chosen block by block (seq2seq.fast.blocks): the same ids
        self.by_blocks = compile_mode is None and device.type == "cpu"
        self.compiled = compile_mode is not None
        self.freezing = freezing
        self.reorders = reorders
        self.step = compiled(self.reordered_log_probs if reorders else self.log_probs, compile_mode, freezing)
        self.ids_step = compiled(self.most_likely, compile_mode, freezing)
        self.cache = None  # the model's static cache, kept from one batch to the next
        self.started_for: tuple | None = None  # (src shape, beams, mask heads, device, dtype) of the cache
        self.last: Tensor | None = None  # (B, 1): the ids the next step reads
        self.position: Tensor | None = None  # (): the position the next step writes
        self.origin: Tensor | None = None  # (B,): the row each row continues (beam search)

    def start(self, src: Tensor, src_mask: Tensor | None, beams: int = 1) -> None:
        """Encode the (B, S) source once and start (or refill, if started for a batch of this
        shape) a cache of B·``beams`` rows, row i·beams + j the j-th beam of source i."""
        memory = self.model.encode(src, src_mask)  # (B, S, D); encode checks src and src_mask
        if src_mask is not None:
            src_mask = batch_first(src_mask, src.shape[0])  # (B, 1 or H, 1, S)
        heads = 1 if src_mask is None else src_mask.shape[1]
        # a cache made in inference mode may be refilled in place only in inference mode
        shape = (tuple(src.shape), beams, heads, src.device, memory.dtype, torch.is_inference_mode_enabled())
        out = self.cache if shape == self.started_for else None
        # the memory's keys and values once per source, the self-attention's once per row
        self.cache = self.model.start_static_cache(memory, src_mask, self.max_len, out=out, beams=beams)
        self.started_for = shape
        rows = memory.shape[0] * beams
        if out is None:
            self.last = torch.zeros(rows, 1, dtype=torch.long, device=src.device)  # (B, 1)
            self.position = torch.zeros((), dtype=torch.long, device=src.device)  # ()
            # (B,); a refill keeps the last batch's: at the first step every beam of a source
            # holds the same BOS, so moving rows within a source changes nothing
            self.origin = torch.arange(rows, device=src.device)
            # a CUDA graph writes these in place: only at addresses it may keep. Not with freezing,
            # which would fold tensors of static address into the graph as constants, so a refill
            # would go unseen
            if self.compiled and not self.freezing:
                for buffer in self.cache.buffers():
                    torch._dynamo.mark_static_address(buffer, guard=True)

    def decoding(self) -> AbstractContextManager:
        """The grad mode a decoder's call runs in: eager, inference mode (no version counter or
        view is tracked, so each of a step's many small ops costs less); compiled, no_grad (what
        its graphs are captured under)."""
        return torch.no_grad() if self.compiled else torch.inference_mode()

    def log_probs(self, last: Tensor, position: Tensor, cache: object) -> Tensor:
        """The step itself, what ``torch.compile`` captures: (B, 1) ids -> (B, V)."""
        return apply_ban(self.model.project(self.model.static_step(last, position, cache))[:, -1], self.ban)

    def reordered_log_probs(self, last: Tensor, position: Tensor, origin: Tensor, cache: object,
                            written: int | None) -> Tensor:
        """Beam search's step: each row continues row ``origin`` (B,) in the first ``written``
        slots (None: all), then ``log_probs``."""
        cache.reorder_beams(origin, written)
        return self.log_probs(last, position, cache)

    def most_likely(self, last: Tensor, position: Tensor, cache: object) -> Tensor:
        """Greedy decoding's step: (B, 1) ids -> (B,) the ids of the largest logits."""
        logits = apply_ban(self.model.generator(self.model.static_step(last, position, cache))[:, -1],
                           self.ban)  # (B, V)
        return blocks.argmax(logits) if self.by_blocks else logits.argmax(dim=-1)

    def reorder(self, origin: Tensor) -> None:
        """Row i continues old row ``origin[i]`` (B,) from the next call on; a row may only
        continue a row of its own source (beam search's rule)."""
        self.origin.copy_(origin)

    def step_cache(self, tokens: Tensor) -> object:
        """The cache the step after ``tokens`` (B, L) steps on: compiled, the whole cache (its
        shapes never change); eager, its window of the L positions written by then (the step's
        own included), so the step attends over L slots, not ``max_len``."""
        return self.cache if self.compiled else self.cache.window(tokens.shape[1])

    def feed(self, tokens: Tensor) -> None:
        """The next step reads the last column of ``tokens`` (B, L) at position L - 1."""
        self.last.copy_(tokens[:, -1:])
        self.position.fill_(tokens.shape[1] - 1)
        if self.compiled:  # a new iteration: the previous step's outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()

    def __call__(self, tokens: Tensor) -> Tensor:
        self.feed(tokens)
        if not self.reorders:
            return self.step(self.last, self.position, self.step_cache(tokens))  # (B, V)
        # eager, only the slots written so far move; compiled, every slot (its shapes stay)
        written = None if self.compiled else tokens.shape[1] - 1
        return self.step(self.last, self.position, self.origin, self.step_cache(tokens), written)  # (B, V)

    def next_ids(self, tokens: Tensor) -> Tensor:
        """(B, L) prefixes -> (B,) the most likely next ids (greedy decoding)."""
        self.feed(tokens)
        return self.ids_step(self.last, self.position, self.step_cache(tokens))  # (B,)


class StaticGreedy:
    """Greedy decoding, ``max_len`` ids per row counting BOS, on ``StaticNextToken``: the
    arguments and result of ``greedy_decode``, checked the same way (``check_arguments``) but once,
    here; a call checks only its source and mask. A call decodes in eval mode whatever mode the
    model is in, and gives each module its mode back, as ``greedy_decode`` does.
    ``from_logits`` False takes the argmax of the log-probabilities instead (the same ids).
    ``banned_ids`` are never chosen, as in ``greedy_decode``."""

    def __init__(self, model: nn.Module, *, max_len: int, bos_id: int, eos_id: int,
                 compile_mode: str | None = None, freezing: bool = False, onednn: bool = False,
                 onednn_dtype: torch.dtype = torch.float32, from_logits: bool = True,
                 banned_ids: tuple[int, ...] = (), flat: bool = False) -> None:
        self.config = check_arguments(model, None, max_len, bos_id, eos_id, True, max_len_may_be_none=False,
                                      banned_ids=banned_ids)
        self.max_len, self.bos_id, self.eos_id = max_len, bos_id, eos_id
        self.from_logits = from_logits
        self.next_token_logp = StaticNextToken(model, max_len, compile_mode, freezing=freezing, onednn=onednn,
                                               onednn_dtype=onednn_dtype, banned_ids=banned_ids, flat=flat)

    def __call__(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """(B, S) source ids -> (B, L) target ids: BOS, then the argmax at each step, padding
        after a row's EOS; stops when every row has produced EOS, or at ``max_len`` ids. In eval
        mode, each module's mode given back afterwards; without grad (``decoding``), the ids
        handed back as an ordinary tensor."""
        check_source(src, src_mask)  # the settings were checked when this decoder was built
        step = self.next_token_logp
        with step.decoding(), eval_mode(step.model):
            step.start(src, src_mask)
            batch = src.shape[0]
            tokens = torch.full((batch, self.max_len), self.config.pad_id, dtype=torch.long,
                                device=src.device)  # (B, max_len), filled from the left
            tokens[:, 0] = self.bos_id
            finished = torch.zeros(batch, dtype=torch.bool, device=src.device)  # (B,)
            length = 1
            # argmax ids lie in [0, V) and positions in [0, max_len): nothing for the checks to read
            with ids_range_checked():
                while length < self.max_len:
                    prefix = tokens[:, :length]  # (B, length)
                    # (B,): the largest logit's id, or the largest log-probability's (the same)
                    next_token = step.next_ids(prefix) if self.from_logits else step(prefix).argmax(dim=-1)
                    tokens[:, length] = next_token.masked_fill(finished, self.config.pad_id)
                    finished |= tokens[:, length] == self.eos_id
                    length += 1
                    if finished.all():
                        break
        return tokens[:, :length].clone()  # outside inference mode: a tensor autograd may save


class StaticBeam:
    """Beam search on ``StaticNextToken``, B sources x ``beam_size`` beams as B·k rows of one
    static cache: the arguments and result of ``beam_search`` with a given ``max_len`` (the
    cache's positions), through the same ``search``. The settings are checked once, here
    (``check_beam_arguments``); a call checks only its source and mask. A call decodes in eval
    mode whatever mode the model is in, and gives each module its mode back, as ``beam_search``
    does. ``banned_ids`` are never chosen, as in ``beam_search``."""

    def __init__(self, model: nn.Module, *, max_len: int, bos_id: int, eos_id: int,
                 beam_size: int = BEAM_SIZE, alpha: float = ALPHA, compile_mode: str | None = None,
                 freezing: bool = False, onednn: bool = False,
                 onednn_dtype: torch.dtype = torch.float32, banned_ids: tuple[int, ...] = (),
                 flat: bool = False) -> None:
        self.arguments = dict(max_len=max_len, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, alpha=alpha)
        self.config = check_beam_arguments(model, None, None, **self.arguments, use_cache=True,
                                           max_len_may_be_none=False, banned_ids=banned_ids)
        self.next_token_logp = StaticNextToken(model, max_len, compile_mode, freezing=freezing, onednn=onednn,
                                               onednn_dtype=onednn_dtype, reorders=True,
                                               banned_ids=banned_ids, flat=flat)

    def __call__(self, src: Tensor, src_mask: Tensor | None = None) -> Hypotheses:
        """(B, S) source ids -> the best hypothesis of each, as ``beam_search`` finds it. In eval
        mode, each module's mode given back afterwards; without grad (``decoding``), the
        hypotheses handed back as ordinary tensors."""
        check_source(src, src_mask)  # the settings were checked when this decoder was built
        arguments, step = self.arguments, self.next_token_logp
        with step.decoding(), eval_mode(step.model):
            step.start(src, src_mask, beams=arguments["beam_size"])
            limit = torch.full((src.shape[0],), arguments["max_len"] - 1, device=src.device)  # (B,)
            dtype = torch.promote_types(step.cache.dtype, torch.float32)  # as beam_search adds them up
            with ids_range_checked():  # the search's ids lie in [0, V), its positions in [0, max_len)
                best = search(step, limit, dtype, bos_id=arguments["bos_id"], eos_id=arguments["eos_id"],
                              pad_id=self.config.pad_id, beam_size=arguments["beam_size"],
                              alpha=arguments["alpha"],
                              extend=blocks.best_extensions if step.by_blocks else best_extensions)
        return Hypotheses(best.tokens.clone(), best.scores.clone())  # outside inference mode


def static_greedy_decode(model: nn.Module, src: Tensor, src_mask: Tensor | None = None, *,
                         max_len: int, bos_id: int, eos_id: int, compile_mode: str | None = None,
                         freezing: bool = False, onednn: bool = False,
                         banned_ids: tuple[int, ...] = (), flat: bool = False) -> Tensor:
    """One call of a fresh ``StaticGreedy``: the same tokens as ``greedy_decode``."""
    return StaticGreedy(model, max_len=max_len, bos_id=bos_id, eos_id=eos_id, compile_mode=compile_mode,
                        freezing=freezing, onednn=onednn, banned_ids=banned_ids, flat=flat)(src, src_mask)


def static_beam_search(model: nn.Module, src: Tensor, src_mask: Tensor | None = None, *, max_len: int,
                       bos_id: int, eos_id: int, beam_size: int = BEAM_SIZE, alpha: float = ALPHA,
                       compile_mode: str | None = None, freezing: bool = False,
                       onednn: bool = False, banned_ids: tuple[int, ...] = (),
                       flat: bool = False) -> Hypotheses:
    """One call of a fresh ``StaticBeam``: the same hypotheses as ``beam_search``."""
    return StaticBeam(model, max_len=max_len, bos_id=bos_id, eos_id=eos_id, beam_size=beam_size, alpha=alpha,
                      compile_mode=compile_mode, freezing=freezing, onednn=onednn,
                      banned_ids=banned_ids, flat=flat)(src, src_mask)
