"""Source 3's style: each component from its equation, parameters in the paper's notation."""

from variants.mathfirst.model import Transformer

__all__ = ["Transformer"]
