"""The model, in reading order: attention.py (MultiHeadAttention, its score-scale variants and its
one SDPA call), gpt.py (the decoder-only transformer), diagnostics.py (attention statistics and
q/k gradient norms), errors.py (UserError, ConfigError, DataError and the value checks).

attention.py imports diagnostics.py and errors.py; gpt.py imports attention.py and errors.py.
This file imports nothing, so that `from model.errors import UserError` (data/, train.py) does
not import torch.
"""
