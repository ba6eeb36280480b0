"""How a trained model writes: greedy decoding, the paper's beam search, and greedy decoding
over a fixed-shape cache that a compiled step can replay.

    greedy  greedy_decode, and NextToken, the cached next-token step beam search shares
    beam    beam search as the paper runs it (beam 4, length penalty 0.6)
    static  static_greedy_decode over a variant's static cache (fused), for torch.compile
"""
