"""How a model learns: the paper's recipe, a run that checkpoints and resumes exactly, the same
run over several processes, and the average of its last checkpoints.

    recipe       Recipe, the learning-rate schedule, Adam, the smoothed loss, train_step, StepReport
    trainer      Trainer (a run in progress, checkpointed and restored exactly), train, seed_dropout,
                 check_resumable (the file format itself is seq2seq.storage's)
    distributed  torchrun's world, the process group, batch shards and sums over ranks (DDP)
    run          a run driven to its end (RunSettings, start, train, RunError), its checkpoints'
                 names in its directory (checkpoint_path, list_checkpoints, latest_checkpoint)
    averaging    checkpoint averaging (paper section 6.1): average_weights, average_files
"""
