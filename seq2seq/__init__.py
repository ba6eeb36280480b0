"""What uses a model: synthetic tasks, greedy decoding, and the paper's training recipe.

Everything here reaches a variant only through ``variants.build`` and the shared interface
(``encode``, ``decode``, ``project``), so it works the same for every registered variant.
"""
