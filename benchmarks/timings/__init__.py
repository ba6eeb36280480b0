"""The pytest-benchmark timings: small, repeatable timings of one step each, run by pytest.

    pytest benchmarks/timings/                           # minutes on 2 cores
    pytest benchmarks/timings/bench_layernorm.py --benchmark-columns=median,iqr

    conftest            the allocator policy and thread choice compare.py uses; the cores' load
    bench_speed         the small preset's forward and train step, per variant (CPU, and CUDA)
    bench_decode        the decoders of compare.py --all-decoders (greedy cached and by recompute, beam 4)
    bench_engines       the deployment engines' decoding beside PyTorch's
    bench_layernorm     each variant's LayerNorm alone
    bench_dropout_masks compiled dropout with masks from aten against inductor's own
    bench_range_check   what the id-range check's host sync costs a small CUDA forward

Not collected by a plain ``pytest`` (its testpaths are tests/); pyproject's ``python_files``
names ``bench_*.py``, so a path under benchmarks/ collects them. The library they time is the
package above (``benchmarks.compare.steps``, ``benchmarks.compare.workload``, ...).
"""
