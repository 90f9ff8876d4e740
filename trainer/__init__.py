"""Training: build a run, step, evaluate, checkpoint, write the run directory (docs/training.md)."""
