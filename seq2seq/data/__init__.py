"""What a model reads: token ids, the synthetic tasks, the translation corpus, its subword
vocabulary, and the batches drawn from them.

    ids       PAD_ID, BOS_ID, EOS_ID: the special ids the tasks and the vocabulary share
    tasks     the copy/reverse tasks and their seeded training stream (TaskData, TaskBatches)
    corpus    a Tatoeba-style pair file read, normalised, deduplicated and split (Corpus)
    subwords  the joint sentencepiece vocabulary (Vocabulary, train_vocabulary)
    batches   text pairs as ids and their seeded stream of token-counted batches (TokenBatches)
"""
