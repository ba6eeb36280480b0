"""Checkpoints trained elsewhere, as model files every variant loads: Hugging Face's
MarianMTModel (Helsinki-NLP opus-mt) and FSMTForConditionalGeneration (fairseq's WMT19)
(docs/real-checkpoints.md; ``python -m seq2seq.convert`` is the command).

    families    each family's config read as a TransformerConfig, and the declarative map from
                its Hugging Face tensors to the canonical weights
    from_hf     a Hugging Face model (a folder, or a hub name) to a ModelFile: the map checked
                whole (shapes, every tensor read or known, the sinusoid table), forbidden ids
                banned in the generator's bias, the tokenizer carried
    tokenizers  the two tokenizers as the model file carries them: Marian's two sentencepiece
                models and vocabulary, fairseq's Moses + BPE
    tiny        tiny checkpoints of both families built without a network, and Hugging Face's
                model in float64 with its pitfalls met: the proofs' models

transformers (and sacremoses, for fairseq's tokenizer) are the optional ``hf`` extra: a module
here imports them only when called, and a missing one is an ImportError naming the extra.
"""
