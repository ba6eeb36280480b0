"""What uses a model, laid out as its pipeline: data -> training -> decoding -> scoring ->
deployment, with the commands users type at the top.

    data/         ids (PAD/BOS/EOS), tasks (copy/reverse), corpus (Tatoeba pairs), subwords
                  (the joint vocabulary), batches (the seeded stream of token batches)
    storage/      model_file: the one file format (model files and checkpoints) that training
                  writes, conversion and export read and write, and every command reads
    training/     recipe (schedule, Adam, smoothed loss), trainer (exact resume), distributed
                  (DDP), averaging (paper section 6.1), run (a run driven to its end: fresh or
                  resumed, progress bar, checkpoints)
    search/       the teaching decoders: strategy (what every search shares: the next-token
                  step, eval mode, argument checks), greedy, beam (the paper's beam search)
    fast/         the fast decoding path: static_search (greedy and beam over a fixed-shape
                  cache, for torch.compile and CUDA graphs), onednn (packed oneDNN linears);
                  it uses private torch APIs, and search/ never imports it
    evaluation    held-out accuracy of the synthetic tasks; corpus BLEU and chrF
    pipeline      the translation pipeline: settings and presets, a run in minutes or steps,
                  translate and evaluate text (``translate_sentences``, ``evaluate``)
    options       python -m seq2seq.train's options and the run's settings they make (TrainSettings)
    deploy/       export_config (the config beside an export, the source checks), onnx_runtime,
                  ctranslate (the exporters and their runtimes as decode rows)
    hub/          checkpoints trained elsewhere (Hugging Face's Marian and FSMT): families (config
                  and weight map), from_hf (a Hugging Face folder to a model file), tokenizers
                  (carried in the model file), to_hf (a model file to a MarianMTModel folder),
                  tiny (the proofs' tiny checkpoints)

    train         python -m seq2seq.train (synthetic tasks, or --task translate)
    translate     python -m seq2seq.translate (translate and score with a model file)
    average       python -m seq2seq.average (average a run's last checkpoints)
    decode        python -m seq2seq.decode (a saved model's held-out accuracy)
    convert       python -m seq2seq.convert (a Hugging Face model to a model file)
    export_hf     python -m seq2seq.export_hf (a model file to a Hugging Face MarianMTModel folder)

A command is named for what a user does (train, translate, average, decode, convert), a library for what
it holds (training/, pipeline, averaging, search/), so that no two names can be taken for one.

The subpackages never import the top-level modules: ``evaluation`` and ``pipeline`` join
them, and the commands are thin shells over all of it. Everything here reaches a variant only
through ``variants.build`` and the shared interface (``encode``, ``decode``, ``project``, and
the public export stages of a variant that has them), so it works the same for every registered
variant. The library prints nothing; no module imports from a command-line module.
"""
