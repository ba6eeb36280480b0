"""The one configuration object every module of every variant is built from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from common.checks import check_number

# The values of the string fields below (docs/architecture.md, "Config").
ACTIVATIONS = ("relu", "gelu", "silu")  # the feed-forward's nonlinearity, by torch.nn.functional's name
POSITIONS = ("paper", "marian", "fairseq")  # the sinusoid table added to the embeddings (common/positions.py)
DECODER_STARTS = ("bos", "pad", "eos")  # which id the decoder's first position holds

@dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of the encoder–decoder Transformer; defaults are the paper's base model."""

    d_model: int = 512  # D: width of every token vector between sublayers
    n_heads: int = 8  # H: attention heads; d_model must split evenly into them
    n_layers: int = 6  # N: layers in the encoder stack, and again in the decoder stack
    d_ff: int = 2048  # inner width of the position-wise feed-forward network
    dropout: float = 0.1  # P_drop on embeddings, attention weights, FFN hidden and sublayer outputs
    src_vocab_size: int = 37000  # source token ids lie in [0, src_vocab_size)
    tgt_vocab_size: int = 37000  # target token ids lie in [0, tgt_vocab_size); also the generator's width
    max_seq_len: int = 512  # longest source or target sequence; sizes the sinusoid table
    norm_eps: float = 1e-6  # added to the variance inside LayerNorm's square root
    norm_first: bool = False  # False: post-norm, the paper; True: pre-norm, x + sublayer(norm(x))
    pad_id: int = 0  # the padding token id, in both vocabularies
    share_embeddings: bool = False  # one matrix for both embeddings and the generator (section 3.4)
    # What a checkpoint trained elsewhere needs (Marian, fairseq); the defaults are the paper's model.
    activation: str = "relu"  # the FFN's nonlinearity: "relu" (the paper), "gelu", or "silu" (swish)
    final_norm: bool = True  # a LayerNorm after each stack (as torch.nn.Transformer); False: none
    positions: str = "paper"  # the sinusoid table: "paper", "marian" or "fairseq" (common/positions.py)
    decoder_d_ff: int | None = None  # the decoder's FFN inner width; None: d_ff, as the encoder's
    decoder_start: str = "bos"  # the decoder's first id: "bos", "pad" (pad_id: Marian), "eos" (fairseq)

    @property
    def head_dim(self) -> int:
        """Dh = d_k = d_v = d_model / n_heads (section 3.2.2)."""
        return self.d_model // self.n_heads

    @property
    def decoder_ff_dim(self) -> int:
        """The decoder's feed-forward inner width: decoder_d_ff, or d_ff where that is None."""
        return self.d_ff if self.decoder_d_ff is None else self.decoder_d_ff

    def replace(self, **changes) -> TransformerConfig:
        """A copy with some fields changed (and validated again)."""
        return dataclasses.replace(self, **changes)

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            expected = {"int": int, "float": (int, float), "bool": bool, "str": str,
                        "int | None": (int, type(None))}[str(field.type)]
            # bool is an int subclass: True must not pass for d_model, nor 1 for norm_first.
            if isinstance(value, bool) != (expected is bool) or not isinstance(value, expected):
                raise TypeError(
                    f"TransformerConfig.{field.name} must be {field.type}, "
                    f"got {type(value).__name__} {value!r}"
                )
        for name in ("d_model", "n_heads", "n_layers", "d_ff", "src_vocab_size",
                     "tgt_vocab_size", "max_seq_len", "decoder_d_ff"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"TransformerConfig.{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"TransformerConfig.d_model ({self.d_model}) must be divisible by "
                f"n_heads ({self.n_heads})"
            )
        check_number("TransformerConfig.dropout", self.dropout, high=1.0, low_closed=True)
        # an infinite norm_eps would flatten every LayerNorm output to its bias
        check_number("TransformerConfig.norm_eps", self.norm_eps)
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                f"TransformerConfig.share_embeddings needs one vocabulary: src_vocab_size "
                f"({self.src_vocab_size}) must equal tgt_vocab_size ({self.tgt_vocab_size})"
            )
        for name, allowed in (("activation", ACTIVATIONS), ("positions", POSITIONS),
                              ("decoder_start", DECODER_STARTS)):
            if getattr(self, name) not in allowed:
                hint = " (swish is SiLU: write 'silu')" if getattr(self, name) == "swish" else ""
                raise ValueError(f"TransformerConfig.{name} must be one of {allowed}, "
                                 f"got {getattr(self, name)!r}{hint}")
        if self.positions == "fairseq" and self.d_model < 4:
            # its frequencies are 10000^(-k / (d_model / 2 - 1)): d_model 2 or 3 divides by zero
            raise ValueError(f"TransformerConfig.positions 'fairseq' needs d_model >= 4, got {self.d_model}")
        smallest_vocab = min(self.src_vocab_size, self.tgt_vocab_size)
        if not 0 <= self.pad_id < smallest_vocab:
            raise ValueError(
                f"TransformerConfig.pad_id ({self.pad_id}) must lie in [0, {smallest_vocab}), "
                f"inside both vocabularies (src_vocab_size={self.src_vocab_size}, "
                f"tgt_vocab_size={self.tgt_vocab_size})"
            )


# The paper's Table 3 models, by name: shared embeddings over a 37,000-token vocabulary
# (the paper's shared BPE vocabulary is "about 37000"; its exact size is not published).
MODEL_PRESETS: dict[str, TransformerConfig] = {
    "paper-base": TransformerConfig(share_embeddings=True),  # 512/8/6/2048, P_drop 0.1
    "paper-big": TransformerConfig(d_model=1024, n_heads=16, d_ff=4096, dropout=0.3,
                                   share_embeddings=True),
}
