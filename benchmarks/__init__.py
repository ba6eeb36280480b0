"""Measuring: ``python compare.py``'s engine, the decode rows of other engines, the studies
that each answer one question about speed or numbers, and the pytest-benchmark timings.

    compare/   compare.py's engine, the only thing compare.py imports: the workload, the timed
               steps, the run's settings, rounds, processes, ratios with their intervals, the
               report and how it is rendered (its own index names each module)
    engines/   decode rows for engines beside the variants (ONNX Runtime, CTranslate2, PyTorch's
               fast path) and the child process an engine runs in when it must have its own
    studies/   stand-alone programs, each ``python -m benchmarks.studies.NAME``, each printing a
               measurement of the machine it runs on (decode scan, static decode, GEMM paths,
               compile masks, time breakdown, low precision, bfloat16 decoding, coverage, learners)
    timings/   pytest-benchmark timings (``pytest benchmarks/``; not run by a plain ``pytest``)

A program belongs here, not in ``scripts/``, when what it prints is a measurement of the machine
it runs on (time, memory, bandwidth, the rounding of its kernels, a training run): the kind a page
of docs/results/ records with its date and machine. ``scripts/`` holds the programs whose output
the code alone decides. Imports run one way inside: ``studies`` may use ``compare`` and
``engines``; ``compare`` uses ``engines``; ``engines`` uses neither.
"""
