"""The fast decoding path, beside the engines (benchmarks/engines/rows.py lists its rows, "inductor",
"onednn" and "int8", next to ONNX Runtime and CTranslate2): greedy decoding and beam search over
a fixed-shape static cache, for torch.compile and CUDA graphs, and the model's linears on
oneDNN's packed product or on int8 weights. It gives the tokens and hypotheses of the teaching
decoders in ``seq2seq.search`` (and its tests prove it), faster, at the cost of reading less
plainly; int8 gives them wherever the margins exceed its rounding.

    static_search  StaticNextToken (one static step per call, compiled or eager), StaticGreedy
                   and StaticBeam (decoders built once, called per batch), static_greedy_decode
                   and static_beam_search (one call of a fresh decoder)
    onednn         OneDnnLinear and with_onednn_linears: a copy of the model whose linears run
                   oneDNN's product on weights packed once (float32 or bfloat16)
    int8           Int8Linear and with_int8_linears: a copy whose linears hold int8 weights (per
                   output channel) and multiply in int8, inputs quantized per call (fbgemm)
    flat           FlatDecoding: fused's eager step as one function over the decoder's weights,
                   keys and values heads first, attention by two matrix products (``flat=True``)
    blocks         argmax and beam search's k best extensions found block by block over the
                   vocabulary: the same ids as ``argmax`` and ``topk`` (eager, on the CPU)

Unlike the rest of seq2seq it uses private torch APIs, which a torch release may change or
remove: ``torch._inductor.list_mode_options`` (what ``torch.compile(mode=...)`` sets, so that
freezing can be added on top) and ``torch._dynamo.mark_static_address`` (the cache's buffers, so
a CUDA graph may keep their addresses) in static_search; ``torch.ops.mkldnn._linear_pointwise``
and ``torch.ops.mkldnn._reorder_linear_weight`` (oneDNN's packed product and its weight packing)
in onednn; and in int8, APIs deprecated with ``torch.ao.quantization``
(``torch.quantize_per_channel``, ``torch.ops.quantized.linear_prepack``, ``linear_dynamic`` and
``linear_unpack``), their quantized-tensor warning silenced while packing. The model must have a
static step (``start_static_cache``/``static_step``: ``variants.fused``).

It builds on ``seq2seq.search`` (the shared checks and next-token contract of
``seq2seq.search.strategy``, beam search's ``search``); the teaching decoders in
``seq2seq.search`` never import it, so they read without it.
"""
