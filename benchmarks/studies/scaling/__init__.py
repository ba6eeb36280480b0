"""How each row's cost grows with the work: forward and train-step time and peak memory against
the length S (a fixed number of tokens per batch, and a fixed batch), decoding's time per token
against the tokens already in the cache, the exponent of each growth, where attention's share
passes half, and each row's peak memory predicted from its tensors' shapes beside the measured.

    python -m benchmarks.studies.scaling --preset tiny --json scaling.json --plot scaling.png

    analysis   the fits and predictions: the exponent of a growth with its interval, the
               crossing of a share, the peak memory from the shapes, the memory wall (prints nothing)
    sweep      the measurements: the two sweeps, the attention core alone, the decode scan
    __main__   the command line over them: options, progress, the tables, the JSON, the picture
"""
