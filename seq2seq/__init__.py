"""What uses a model: synthetic tasks, the paper's training recipe, training runs, evaluation,
greedy and beam decoding, checkpoints, and the commands that train, average and decode.

    tasks        the copy/reverse tasks and the seeded training stream (TaskData, TaskBatches)
    recipe       Recipe, the learning-rate schedule, Adam, the smoothed loss, train_step, StepReport
    trainer      Trainer (a run in progress, checkpointed and restored exactly), train, seed_dropout
    distributed  torchrun's world, the process group, batch shards and sums over ranks (DDP)
    checkpoint   checkpoints that resume a run exactly, model files any variant loads
    evaluation   the held-out set, exact-match accuracy of greedy decoding, its report line
    greedy       greedy_decode, and NextToken, the cached next-token step beam search shares
    beam         beam search as the paper runs it (beam 4, length penalty 0.6)
    train        the command line: python -m seq2seq.train (training, checkpoints, accuracy)
    average      checkpoint averaging, and its command line: python -m seq2seq.average
    decode       the command line: python -m seq2seq.decode (a saved model's held-out accuracy)

Everything here reaches a variant only through ``variants.build`` and the shared interface
(``encode``, ``decode``, ``project``), so it works the same for every registered variant. The
library modules print nothing; the command lines are thin shells over them, and no module
imports from a command-line module.
"""
