"""Source 2's style: attention with torch.einsum, one module per class, one block in two roles."""

from variants.einsum.model import Transformer

__all__ = ["Transformer"]
