"""Programs whose output the code alone decides: they read the variants and generate docs. Each
runs as ``python -m scripts.NAME`` from the repository root (scripts/ is not installed: pyproject
installs common, variants, seq2seq and benchmarks only, so elsewhere Python answers ``No module
named 'scripts'``).

Reading:

    trace           one forward pass, module by module, with the shape each returns
    deviations      what each source's departures from the one architecture do to the output
    checkpoint_deviations  what each thing the converter gets right does to a Hugging Face
                    checkpoint (Marian, FSMT), one at a time, and Hugging Face's pitfalls
    pictures        the sinusoid table and one layer's attention weights; a translation's
                    cross-attention

Generating docs:

    side_by_side    docs/side-by-side.html and .md: each concept's equation above the three styles' code
    architecture    docs/images/architecture.svg: Figure 1's boxes, each linked to the styles' code
    layout          docs/architecture.md's layout tree: each package with its index's first sentence
    concept_map/    the README's concept map read: each concept, then each style's symbols by file
                    and line (its __main__); the package is the reader side_by_side and
                    architecture import to draw the map

Running the device checks:

    gpu_check.sh    the device checks in one run (``bash scripts/gpu_check.sh``)

The rule: a program whose output the code alone decides (the same on any machine) lives here; a
program that measures the machine it runs on (time, memory, bandwidth, the rounding of its
kernels, a training run) lives in ``benchmarks/`` (``python -m benchmarks.studies.NAME``), beside the
library it measures with.

A leaf: a program here may import the library (``benchmarks`` and everything below it); nothing
outside scripts/ imports a program here, except the tests that run them. Within scripts/, only the
concept_map package is imported (by side_by_side and architecture), never its ``__main__``. Each
program prints or writes its files; the library beneath, concept_map's reader included, does
neither.
"""
