"""Decode rows for engines beside the variants, timed by compare.py like any other row.

    rows       the rows: ONNX Runtime and CTranslate2 (each in float32 and int8), PyTorch's fast
               path (inductor, oneDNN in float32 and bfloat16), a Hugging Face model as converted
    isolated   an engine built and called in a process of its own: CTranslate2's OpenMP threads
               would slow torch's in the same process (``Isolated``; its CPU time is counted)
    server     the child process ``isolated`` starts (``python -m benchmarks.engines.server``;
               not run by hand)

The exporters and runtimes themselves are ``seq2seq.deploy``'s and ``seq2seq.fast``'s; this
package only builds them as rows. Nothing here imports compare.py's engine (``benchmarks.compare``).
"""
