"""Text to training batches in bounded memory (docs/data.md; files: docs/training.md, "Layers")."""
