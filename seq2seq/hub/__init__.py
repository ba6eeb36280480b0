"""Checkpoints trained elsewhere, as model files every variant loads: Hugging Face's
MarianMTModel (Helsinki-NLP opus-mt) and FSMTForConditionalGeneration (fairseq's WMT19)
(docs/real-checkpoints.md; ``python -m seq2seq.convert`` is the command).

    families    each family's config read as a TransformerConfig, and the declarative map from
                its Hugging Face tensors to the canonical weights
    hf_folder   a Hugging Face folder read through common.files and checked against itself
                (the weights file against its config, the tokenizer's files, the generation
                settings) before transformers builds anything from it
    from_hf     a Hugging Face model (a folder, or a hub name) to a ModelFile: the map checked
                whole (shapes, every tensor read or known, the sinusoid table), forbidden ids
                carried as the file's banned_ids (a decoding setting), the tokenizer carried
                (a folder exported from here: the project's vocabulary back)
    to_hf       the way back: a ModelFile as a MarianMTModel folder (config, safetensors,
                generation config, tokenizer), the paper's positions by a permutation of the
                residual coordinates, what Marian cannot compute refused by field
    tokenizers  the two tokenizers as the model file carries them: Marian's two sentencepiece
                models and vocabulary, fairseq's Moses + BPE
    tiny        tiny checkpoints of both families built without a network, and Hugging Face's
                model in float64 with its pitfalls met: the proofs' models

transformers (and sacremoses, for fairseq's tokenizer) are the optional ``hf`` extra: a module
here imports them only when called, and a missing one is an ImportError naming the extra.
"""
