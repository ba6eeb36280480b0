"""One seed, five learners: every variant trained on real translation from the same seed, on the
same batches, for the same steps, and what each learned; with several seeds, the study of
whether the rows differ more than a row differs from itself.

    python -m benchmarks.studies.learners --data fra-eng.zip --steps 1000 --out runs/learners

    study      the library: the settings, the corpus and vocabulary, one learner's training and
               scoring, the rows run in turn, the study's statistic and its tables (prints nothing)
    __main__   the command line over it (``python -m benchmarks.studies.learners``): options, progress,
               the files it writes, the pictures

What it found: docs/translation.md, "One seed, five learners".
"""
