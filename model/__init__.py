"""The model: attention.py (MultiHeadAttention and its score-scale variants), gpt.py (the
decoder-only transformer), errors.py (UserError and ConfigError).

Deliberately empty of imports, so that `from model.errors import UserError` (data/, train.py)
does not import torch.
"""
