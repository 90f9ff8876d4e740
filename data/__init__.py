"""Text to training batches, in bounded memory: sources stream document pieces, the token cache
is written shard by shard and read back as memmaps (docs/data.md).

Core, what `python train.py` runs, in reading order: config.py (DataConfig), sources.py (the
Shakespeare works and the document rules), tokenizer.py (char), cache.py, prepare.py
(prepare(cfg)), batching.py (batches, and TrainingData: what the trainer reads of any data).
Options, loaded only when a config names them: text.py (data=text), hub.py (Hugging Face
datasets), bpe.py (data.tokenizer=bpe), recall.py (data=recall: generated copy and MQAR tasks).
"""
