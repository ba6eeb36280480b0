"""Programs for reading and measuring the variants, each run as ``python -m scripts.NAME``.

    trace           one forward pass, module by module, with the shape each returns
    deviations      what each source's departures from the one architecture do to the output
    low_precision   how far bfloat16 and float16 log-probs stray from float32
    pictures        the sinusoid table and one layer's attention weights
    time_breakdown  where a train step's time goes, per variant
    decode_scan     how the key/value cache's speed-up grows with the length generated
    compile_masks   where a compiled train step's dropout masks come from, and what it costs
    gpu_check.sh    the device checks in one run (bash scripts/gpu_check.sh)

A leaf: a program here may import the library (``benchmarks`` and everything below it); nothing
in the project imports a program, except the tests that run them. Each prints; the library
beneath does not.
"""
