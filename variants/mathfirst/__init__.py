"""Source 3's style: each component from its equation, parameters in the paper's notation.

    components  each component from its equation (embeddings, positions, attention, LayerNorm,
                feed-forward, add & norm), each verified on its own
    model       the Transformer assembled from them
"""

from variants.mathfirst.model import Transformer

__all__ = ["Transformer"]
