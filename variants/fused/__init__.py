"""Modern PyTorch: fused QKV projections, F.scaled_dot_product_attention, nn.LayerNorm.

    model   the Transformer, its key/value cache and its export stages
    static  the static-shape cached step that torch.compile can capture as a CUDA graph
"""

from variants.fused.model import Transformer

__all__ = ["Transformer"]
