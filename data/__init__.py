"""Text to training batches. The files, in reading order:

    config.py      DataConfig: which corpus, which tokenizer, how batches are packed
    sources.py     where raw documents come from (shakespeare, text files, hub datasets),
                   streamed as document pieces cut where tokenization allows
    tokenizer.py   documents to token ids: the char and byte-level BPE tokenizers
    cache.py       the token cache on disk: folder layout, lock, token shards
    prepare.py     prepare(cfg): find or build a config's token cache and map it
    batching.py    token windows or padded documents to (idx, targets) batches
    recall.py      data=recall: generated copy / MQAR sequences instead of a corpus

The data path never holds a whole corpus in memory (the 5 MB Shakespeare works aside): sources
stream pieces, the cache is written shard by shard and read back as memmaps.
"""
