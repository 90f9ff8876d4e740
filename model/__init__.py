"""The model, in reading order: config.py (ScalingConfig, GPTConfig), attention.py (the
equation), gpt.py, diagnostics.py (attention statistics), errors.py (UserError and the checks);
docs/training.md, "Layers", lists every file. This file imports nothing, so
`from model.errors import UserError` and `from model.config import SCALINGS` import no torch."""
