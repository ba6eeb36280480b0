"""Deployment engines as decode rows: the suite's canonical weights exported to ONNX Runtime and
to CTranslate2, and decoded there, proven to give the suite's tokens (docs/deployment.md).

    onnx_runtime  export_onnx(model, directory); OnnxRuntimeModel(directory): encode,
                  start_cache, decode_step and project as ONNX Runtime sessions, so that
                  seq2seq.search's greedy_decode and beam_search drive it unchanged
    ctranslate    export_ctranslate2(model, directory, bos_id=, eos_id=); CTranslate2Model:
                  greedy and beam decoding by ctranslate2.Translator, in the suite's layout
    export_config the suite's config written beside an export, and the source checks both share

Both engines are the optional ``deploy`` extra (onnx, onnxscript, onnxruntime, ctranslate2);
importing a module here without it raises ImportError naming the extra.
"""
