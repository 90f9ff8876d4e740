"""Text to training batches, in bounded memory: sources stream document pieces, the token cache
is written shard by shard and read back as memmaps (docs/data.md).

docs/training.md, "Layers", lists every file in reading order.
"""
