"""Text to training batches, in bounded memory: sources stream document pieces, the token cache
is written shard by shard and read back as memmaps (docs/data.md).

Core, what `python train.py` runs, in reading order: config.py (DataConfig), sources.py (the
default corpus's source), tokenizer.py (what both tokenizers share), cache.py, prepare.py
(prepare(cfg)), batching.py (batches, and TrainingData: what the trainer reads of any data);
then the cache's build path, which prepare loads only when the cache is missing: build_cache.py,
char.py (the char tokenizer), shakespeare.py (reading the works), documents.py (records as
documents). Options, loaded only when a config names them: text.py (data=text), hub.py (Hugging
Face datasets), bpe.py (data.tokenizer=bpe), padded.py (data.packing=pad), recall.py
(data=recall: generated copy and MQAR tasks).
"""
