"""The sample corpus the seq2seq tests write, for the scripts that read a corpus (the learners study)."""

from tests.seq2seq.conftest import sample_corpus  # noqa: F401  (a fixture, found by its name)
