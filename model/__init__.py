"""The model, in reading order: config.py (ScalingConfig, GPTConfig), attention.py (the
equation), gpt.py, diagnostics.py (attention statistics), errors.py (UserError and the checks).

Core: all of these; cpu_autocast.py is an option, built only under CPU autocast
(trainer/build.py). This file imports nothing, so `from model.errors import UserError` and
`from model.config import SCALINGS` import no torch."""
