"""Source 2's style: attention with torch.einsum, one module per class, one block in two roles.

Read bottom up, one module per file:

    self_attention     SelfAttention: multi-head attention as torch.einsum strings
    transformer_block  TransformerBlock: attention + feed-forward, the encoder layer and the
                       decoder's cross-attention half
    decoder_block      DecoderBlock: masked self-attention, then a TransformerBlock
    encoder            Encoder: embeddings, positions, N TransformerBlocks, the final norm
    decoder            Decoder: embeddings, positions, N DecoderBlocks, the final norm, fc_out
    model              Transformer: the Encoder and the Decoder, and the masks they read
"""

from variants.einsum.model import Transformer

__all__ = ["Transformer"]
