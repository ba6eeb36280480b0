"""Stand-alone studies, each a program that answers one question and prints a measurement of the
machine it runs on (``python -m benchmarks.studies.NAME``; nothing imports a program):

    decode_scan        how the key/value cache's speed-up grows with the length generated
    static_decode      static-shape decoding, eager and compiled (CUDA graphs, freezing, oneDNN)
    gemm_paths         which library multiplies a decode step's linears on this CPU, and how fast
    compile_masks      where a compiled train step's dropout masks come from, and what it costs
    time_breakdown     where a train step's time goes, per variant: a table and a picture
    low_precision      how far bfloat16 and float16 log-probs stray from float32 (``MEASURED``)
    bfloat16_decoding  how far decoding on bfloat16 or int8 weights agrees with float32 on a test split
    coverage           how often several compare.py runs' intervals hold their pooled ratio (and
                       the control 1)
    scaling/           how each row's time and memory grow with the length, and decoding's with the
                       cache (``python -m benchmarks.studies.scaling``; its library is ``scaling.analysis``)
    learners/          one seed, five learners: every variant trained on real translation
                       (``python -m benchmarks.studies.learners``; its library is ``learners.study``)

Two modules are libraries of a study, not programs:

    breakdown          one profiled train step's operator time, grouped by what they do (time_breakdown's)
    bandwidth          streaming read bandwidth, the weight bytes a cached step reads (decode_scan's)

A study may use compare.py's engine (``benchmarks.compare``) and the engine rows; neither
imports a study. Each study's dated results are a page of docs/results/ with its JSON.
"""
