"""The model: config.py, attention.py (the equation), gpt.py (docs/training.md, "Layers")."""
