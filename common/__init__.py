"""The core every variant stands on, and nothing that uses a model.

config (``TransformerConfig``), activations (the feed-forward's nonlinearity by name), masks,
positions (the sinusoid table), checks (input checks), cache (the key/value cache of incremental
decoding), probes (the points two models are compared at, and the hooks that capture them; the
finder itself is the checker's, ``variants.check``), interface (``EncoderDecoder``, the
interface every variant implements), weights (canonical weights and their maps), random_batch (a
padded batch of random ids), bfloat16 (whether a device multiplies bfloat16 natively), cli
(helpers for the command lines) and files (the one way a command reads a user's file and checks
where its output goes: a damaged file is one line naming it).
"""
