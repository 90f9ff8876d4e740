"""Text to training batches, in bounded memory: sources stream document pieces, the token cache
is written shard by shard and read back as memmaps. In reading order: config.py (DataConfig),
sources.py, tokenizer.py, cache.py, prepare.py (prepare(cfg)), batching.py, recall.py (data=recall:
generated copy and MQAR sequences instead of a corpus); docs/data.md.
"""
