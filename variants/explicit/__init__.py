"""Source 1's style: nn.Linear projections, heads split with .view/.transpose, one config.

    model   the whole Transformer, top to bottom in one file, one class per box of Figure 1
"""

from variants.explicit.model import Transformer

__all__ = ["Transformer"]
