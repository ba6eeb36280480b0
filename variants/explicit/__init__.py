"""Source 1's style: nn.Linear projections, heads split with .view/.transpose, one config."""

from variants.explicit.model import Transformer

__all__ = ["Transformer"]
