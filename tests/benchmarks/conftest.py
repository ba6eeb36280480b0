"""The sample corpus the seq2seq tests write, for the programs that read a corpus (the learners
study: tests/benchmarks/studies/learners/ and test_program_guards.py)."""

from tests.seq2seq.conftest import sample_corpus  # noqa: F401  (a fixture, found by its name)
