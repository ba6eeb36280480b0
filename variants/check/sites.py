"""Where a model applies dropout, against a named reference's sites: the one check that looks at
training-mode behaviour beyond "dropout 0 is deterministic".

The model runs one batch in train mode with dropout ``P`` under a torch function mode that sees
every ``F.dropout`` (``nn.Dropout`` calls it), every ``F.scaled_dot_product_attention`` and
``F.multi_head_attention_forward`` with a dropout probability, while forward hooks on the probe
map's modules note each point as it completes. A dropout is placed by what it drops and when:

- a (B, H, T_query, T_key) tensor, or an attention function's own dropout: the attention weights
  of the next attention point to complete; H tensors of (B, T_query, T_key), one per head (an
  attention written as a list of heads), are one such site;
- a tensor as wide as a feed-forward's hidden layer (the encoder's ``d_ff``, the decoder's
  ``decoder_ff_dim``), where that width is not d_model: the hidden layer of the next
  feed-forward point of that width;
- a tensor of width d_model after an attention or a feed-forward completed: that sublayer's
  output, before the residual; before a stack's first sublayer: the stack's embeddings;
- anything else (after a norm, after a layer) is a site the architecture does not have.

Two references (``REFERENCES``), each at probability ``config.dropout``: ``torch``,
``torch.nn.Transformer``'s sites and this suite's architecture (docs/architecture.md): each
stack's embeddings, every attention's weights and output, every feed-forward's hidden layer and
output; ``paper``, the paper's (section 5.4, "Residual Dropout"): each stack's embeddings and
every sublayer's output, before the residual, and nothing else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from common.config import TransformerConfig
from common.probes import probe_points, resolve_probes
from common.random_batch import random_batch

P = 0.3  # not the common default 0.1, so a dropout wired to a constant shows
WEIGHTS, OUTPUT, HIDDEN, EMBEDDINGS = ("attention weights", "output, before the residual", "hidden layer",
                                       "embeddings")
ATTENTIONS = (".self_attn", ".cross_attn")
# reference -> how the report names its sites
REFERENCES = {"torch": "torch.nn.Transformer's sites", "paper": "the paper's sites (section 5.4)"}


def expected_sites(config: TransformerConfig, reference: str = "torch") -> list[tuple[str, str]]:
    """(point, what it drops) for every dropout ``reference`` applies, in order."""
    if reference not in REFERENCES:
        raise ValueError(f"reference must be one of {', '.join(REFERENCES)}, got {reference!r}")
    sites = []
    for point in probe_points(config):
        if point.endswith("_embed"):
            sites.append((point, EMBEDDINGS))
        elif point.endswith(ATTENTIONS):
            sites += [(point, WEIGHTS), (point, OUTPUT)] if reference == "torch" else [(point, OUTPUT)]
        elif point.endswith(".ff"):
            sites += [(point, HIDDEN), (point, OUTPUT)] if reference == "torch" else [(point, OUTPUT)]
    return sites


class DropoutWatch(TorchFunctionMode):
    """Records (event, detail) in order: ("drop", (shape, p, attention)) for each dropout applied."""

    def __init__(self, events: list) -> None:
        super().__init__()
        self.events = events

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.dropout:
            p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
            training = args[2] if len(args) > 2 else kwargs.get("training", True)
            if training and p > 0:
                self.events.append(("drop", (tuple(args[0].shape), p, False)))
        elif func is F.scaled_dot_product_attention:
            p = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
            if p > 0:
                self.events.append(("drop", ((), p, True)))
        elif func is F.multi_head_attention_forward:
            p = args[10] if len(args) > 10 else kwargs.get("dropout_p", 0.0)
            training = kwargs.get("training", True)
            if training and p > 0:
                self.events.append(("drop", ((), p, True)))
        return func(*args, **kwargs)


def observed_sites(model: nn.Module, config: TransformerConfig, seed: int = 0
                   ) -> list[tuple[str, str, float]]:
    """(point, what it drops, p) for each dropout ``model`` (built with ``config``) applies in one
    training-mode forward pass; the point is "" where no probe point places it."""
    events: list = []
    modules = dict(model.named_modules())
    hooks = []
    calls: Counter = Counter()

    def done(name: str, points: list[tuple[str, int]]) -> Callable:
        def hook(_module, _inputs, _output) -> None:
            for point, call in points:
                if call == calls[name]:
                    events.append(("done", point))
            calls[name] += 1
        return hook

    by_module: dict[str, list[tuple[str, int]]] = {}
    for point, probe in resolve_probes(model).items():
        if probe is not None:
            by_module.setdefault(probe.module, []).append((point, probe.call))
    hooks = [modules[name].register_forward_hook(done(name, points)) for name, points in by_module.items()]
    batch = random_batch(config, seed=seed)
    try:
        with torch.random.fork_rng(devices=[]), DropoutWatch(events):
            torch.manual_seed(seed)
            model.train()(*batch.inputs())
    finally:
        for handle in hooks:
            handle.remove()
    return place(events, config, (batch.src.shape[0], batch.src.shape[1], batch.tgt.shape[1]))


def _one_head(shape: tuple[int, ...], config: TransformerConfig, batch: tuple[int, int, int] | None) -> bool:
    """A (B, T_query, T_key) tensor: one head's attention weights."""
    if batch is None or len(shape) != 3 or shape[0] != batch[0]:
        return False
    lengths = set(batch[1:])
    return (shape[1] in lengths and shape[2] in lengths
            and shape[2] not in (config.d_model, config.d_ff, config.decoder_ff_dim))


def ff_width(point: str, config: TransformerConfig) -> int:
    """The hidden width of the feed-forward at ``point``: the encoder's d_ff, the decoder's own."""
    return config.d_ff if point.startswith("encoder.") else config.decoder_ff_dim


def place(events: list, config: TransformerConfig, batch: tuple[int, int, int] | None = None,
          ) -> list[tuple[str, str, float]]:
    """The dropout events placed at points (see the module docstring); ``batch`` is (B, S, T) of
    the batch that ran, to know one head's weights by their shape."""
    sites = []
    last = None
    heads: Counter = Counter()  # (point, p) -> per-head drops not yet counted as a site
    for k, (kind, what) in enumerate(events):
        if kind == "done":
            last = what
            continue
        shape, p, attention = what
        upcoming = [point for later, point in events[k + 1:] if later == "done"]
        if _one_head(shape, config, batch):
            point = next((q for q in upcoming if q.endswith(ATTENTIONS)), "")
            heads[(point, p)] += 1
            if heads[(point, p)] == config.n_heads:
                sites.append((point, WEIGHTS, p))
                del heads[(point, p)]
        elif attention or (len(shape) == 4 and shape[1] == config.n_heads):
            point = next((q for q in upcoming if q.endswith(ATTENTIONS)), "")
            sites.append((point, WEIGHTS, p))
        elif shape and shape[-1] != config.d_model and shape[-1] in (config.d_ff, config.decoder_ff_dim):
            point = next((q for q in upcoming if q.endswith(".ff") and ff_width(q, config) == shape[-1]), "")
            sites.append((point, HIDDEN, p))
        elif last is not None and last.endswith((*ATTENTIONS, ".ff")):
            sites.append((last, OUTPUT, p))
        elif upcoming and (last is None or last.endswith("_embed") or _stream(last) != _stream(upcoming[0])):
            sites.append((f"{_stream(upcoming[0])}_embed", EMBEDDINGS, p))
        else:
            sites.append((last, "after this point", p))
    sites += [(point, f"attention weights of {count} of {config.n_heads} heads", p)
              for (point, p), count in heads.items()]
    return sites


def _stream(point: str) -> str:
    return "src" if point.startswith(("src_embed", "encoder")) else "tgt"


def compare_sites(observed: list[tuple[str, str, float]], config: TransformerConfig,
                  reference: str = "torch") -> tuple[list[str], ...]:
    """(missing sites, unexpected sites, sites at another p) against ``reference``'s sites, each
    as "point (what)"."""
    want = Counter(expected_sites(config, reference))
    got = Counter((point, what) for point, what, _ in observed)
    order = {site: k for k, site in enumerate(expected_sites(config, reference))}
    missing = sorted((want - got).elements(), key=lambda site: order[site])
    extra = list((got - want).elements())
    wrong_p = [(point, what, p) for point, what, p in observed if abs(p - config.dropout) > 1e-12]
    return ([f"{point} ({what})" for point, what in missing],
            [f"{point or 'unplaced'} ({what})" for point, what in extra],
            [f"{point or 'unplaced'} ({what}) at p={p:g}" for point, what, p in wrong_p])
