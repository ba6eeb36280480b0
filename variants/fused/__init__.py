"""Modern PyTorch: fused QKV projections, F.scaled_dot_product_attention, nn.LayerNorm."""

from variants.fused.model import Transformer

__all__ = ["Transformer"]
