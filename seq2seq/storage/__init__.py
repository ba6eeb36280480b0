"""The model file: the one format a run writes and every command reads.

    model_file   ModelFile (a trained model in canonical form, loadable into any variant),
                 Checkpoint (a model file plus what a run's next step depends on), save (atomic),
                 load (checked: marker, version, kind, digest), load_checkpoint, build_model

Training writes it (seq2seq.training), conversion and export read and write it (seq2seq.hub),
translate, decode and average read it; none of them owns it, so it lives here, below all of them.
"""
