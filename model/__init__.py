"""The model, in reading order: attention.py, gpt.py, diagnostics.py (attention statistics),
errors.py (UserError and the value checks). This file imports nothing, so that
`from model.errors import UserError` (data/, train.py) does not import torch."""
