"""The model: attention.py (MultiHeadAttention and its score-scale variants, the file to read),
fast_attention.py (its SDPA path and hardware-specific speed routes), diagnostics.py (attention
statistics and q/k gradient norms), gpt.py (the decoder-only transformer), errors.py (UserError
and ConfigError).

Deliberately empty of imports, so that `from model.errors import UserError` (data/, train.py)
does not import torch.
"""
