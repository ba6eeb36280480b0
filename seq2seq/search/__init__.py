"""How a trained model writes: greedy decoding and the paper's beam search, the teaching
decoders, readable beside the paper. The fast path built on them (a fixed-shape static cache for
torch.compile and CUDA graphs, oneDNN linears) is ``seq2seq.fast``; nothing here imports it.

    strategy  what every search shares (OpenNMT-py's decode_strategy idea): NextToken, the cached
              next-token step; eval_mode; the argument checks (check_arguments,
              check_beam_arguments, check_source, check_no_empty_source)
    greedy    greedy_decode
    beam      beam_search as the paper runs it (beam 4, length penalty 0.6), and search, the loop
              the fast path's static beam reuses
"""
