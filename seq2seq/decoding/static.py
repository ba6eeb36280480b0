"""Greedy decoding on a static-shape cached step, for ``torch.compile(mode="reduce-overhead")`` to
capture as a CUDA graph: the same tokens as ``seq2seq.decoding.greedy.greedy_decode``.

    decode = StaticGreedy(model.eval(), max_len=20, bos_id=1, eos_id=2,
                          compile_mode="reduce-overhead")       # or None: eager
    tokens = decode(src, padding_mask(src, pad_id))             # (B, L), L <= 20

The model must have a static step (``start_static_cache`` and ``static_step``: ``variants.fused``).
Its cache holds ``max_len`` positions from the start; every step has the same shapes: the last
id (B, 1) and the position, a 0-d tensor, are buffers this loop refills in place, and the
step's log-probabilities and argmax run inside the compiled function. The only host read per
step is the loop's own stopping test (has every row reached EOS?), outside the step. A
``StaticGreedy`` keeps its cache between calls and refills it for a batch of the same shape, so
a compiled step meets the same buffers again instead of compiling anew.

Shape legend:
    B  batch   S  source length   L  generated length (BOS included)   V  target vocabulary
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from common.cache import batch_first
from common.checks import ids_range_checked
from seq2seq.decoding.greedy import check_arguments, check_no_empty_source

STATIC_METHODS = ("start_static_cache", "static_step")


class StaticNextToken:
    """``NextToken``'s static-shape twin: (B, L) prefixes -> (B, V) log-probabilities of the
    next token, one ``static_step`` each, compiled with ``compile_mode`` unless it is None."""

    def __init__(self, model: nn.Module, max_len: int, compile_mode: str | None = None) -> None:
        missing = [name for name in STATIC_METHODS if not callable(getattr(model, name, None))]
        if missing:
            raise TypeError(f"{type(model).__module__} has no static step ({', '.join(missing)} "
                            "missing): variants.fused has one")
        if compile_mode is not None and not isinstance(compile_mode, str):
            raise TypeError(f"compile_mode must be a torch.compile mode or None, got {compile_mode!r}")
        self.model = model
        self.max_len = max_len
        self.compiled = compile_mode is not None
        self.step = torch.compile(self.log_probs, mode=compile_mode) if self.compiled else self.log_probs
        self.cache = None  # the model's static cache, kept from one batch to the next
        self.started_for: tuple | None = None  # (src shape, mask heads, device, dtype) of the cache
        self.last: Tensor | None = None  # (B, 1): the ids the next step reads
        self.position: Tensor | None = None  # (): the position the next step writes

    def start(self, src: Tensor, src_mask: Tensor | None) -> None:
        """Encode the source; refill the cache if it was started for a batch of this shape."""
        memory = self.model.encode(src, src_mask)  # (B, S, D); encode checks src and src_mask
        heads = 1 if src_mask is None else batch_first(src_mask, src.shape[0]).shape[1]
        shape = (tuple(src.shape), heads, src.device, memory.dtype)
        out = self.cache if shape == self.started_for else None
        self.cache = self.model.start_static_cache(memory, src_mask, self.max_len, out=out)
        self.started_for = shape
        if out is None:
            self.last = torch.zeros(src.shape[0], 1, dtype=torch.long, device=src.device)  # (B, 1)
            self.position = torch.zeros((), dtype=torch.long, device=src.device)  # ()
            if self.compiled:  # a CUDA graph writes these in place: only at addresses it may keep
                for buffer in self.cache.buffers():
                    torch._dynamo.mark_static_address(buffer, guard=True)

    def log_probs(self, last: Tensor, position: Tensor, cache: object) -> Tensor:
        """The step itself, what ``torch.compile`` captures: (B, 1) ids -> (B, V)."""
        return self.model.project(self.model.static_step(last, position, cache))[:, -1]

    def __call__(self, tokens: Tensor) -> Tensor:
        self.last.copy_(tokens[:, -1:])
        self.position.fill_(tokens.shape[1] - 1)
        if self.compiled:  # a new iteration: the previous step's outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        return self.step(self.last, self.position, self.cache)  # (B, V)


class StaticGreedy:
    """Greedy decoding, ``max_len`` ids per row counting BOS, on ``StaticNextToken``: the
    arguments and result of ``greedy_decode`` (which ``check_arguments`` checks the same way)."""

    def __init__(self, model: nn.Module, *, max_len: int, bos_id: int, eos_id: int,
                 compile_mode: str | None = None) -> None:
        self.config = check_arguments(model, None, max_len, bos_id, eos_id, True, max_len_may_be_none=False)
        self.max_len, self.bos_id, self.eos_id = max_len, bos_id, eos_id
        self.next_token_logp = StaticNextToken(model, max_len, compile_mode)

    @torch.no_grad()
    def __call__(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """(B, S) source ids -> (B, L) target ids: BOS, then the argmax at each step, padding
        after a row's EOS; stops when every row has produced EOS, or at ``max_len`` ids."""
        check_arguments(self.next_token_logp.model, src_mask, self.max_len, self.bos_id, self.eos_id, True)
        check_no_empty_source(src, src_mask)
        self.next_token_logp.start(src, src_mask)
        batch = src.shape[0]
        tokens = torch.full((batch, self.max_len), self.config.pad_id, dtype=torch.long,
                            device=src.device)  # (B, max_len), filled from the left
        tokens[:, 0] = self.bos_id
        finished = torch.zeros(batch, dtype=torch.bool, device=src.device)  # (B,)
        length = 1
        # argmax ids lie in [0, V) and positions in [0, max_len): nothing for the checks to read
        with ids_range_checked():
            while length < self.max_len:
                next_token = self.next_token_logp(tokens[:, :length]).argmax(dim=-1)  # (B,)
                tokens[:, length] = next_token.masked_fill(finished, self.config.pad_id)
                finished |= tokens[:, length] == self.eos_id
                length += 1
                if finished.all():
                    break
        return tokens[:, :length]


def static_greedy_decode(model: nn.Module, src: Tensor, src_mask: Tensor | None = None, *,
                         max_len: int, bos_id: int, eos_id: int, compile_mode: str | None = None) -> Tensor:
    """One call of a fresh ``StaticGreedy``: the same tokens as ``greedy_decode``."""
    return StaticGreedy(model, max_len=max_len, bos_id=bos_id, eos_id=eos_id, compile_mode=compile_mode)(
        src, src_mask)
