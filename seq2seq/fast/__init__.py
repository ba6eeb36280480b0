"""The fast decoding path, beside the engines (benchmarks/engines/rows.py lists its rows, "inductor"
and "onednn", next to ONNX Runtime and CTranslate2): greedy decoding and beam search over a
fixed-shape static cache, for torch.compile and CUDA graphs, and the model's linears on
oneDNN's packed product. It gives the tokens and hypotheses of the teaching decoders in
``seq2seq.search`` (and its tests prove it), faster, at the cost of reading less plainly.

    static_search  StaticNextToken (one static step per call, compiled or eager), StaticGreedy
                   and StaticBeam (decoders built once, called per batch), static_greedy_decode
                   and static_beam_search (one call of a fresh decoder)
    onednn         OneDnnLinear and with_onednn_linears: a copy of the model whose linears run
                   oneDNN's product on weights packed once (float32 or bfloat16)

Unlike the rest of seq2seq it uses private torch APIs, which a torch release may change or
remove: ``torch._inductor.list_mode_options`` (what ``torch.compile(mode=...)`` sets, so that
freezing can be added on top) and ``torch._dynamo.mark_static_address`` (the cache's buffers, so
a CUDA graph may keep their addresses) in static_search; ``torch.ops.mkldnn._linear_pointwise``
and ``torch.ops.mkldnn._reorder_linear_weight`` (oneDNN's packed product and its weight packing)
in onednn. The model must have a static step (``start_static_cache``/``static_step``:
``variants.fused``).

It builds on ``seq2seq.search`` (the shared checks and next-token contract of
``seq2seq.search.strategy``, beam search's ``search``); the teaching decoders in
``seq2seq.search`` never import it, so they read without it.
"""
