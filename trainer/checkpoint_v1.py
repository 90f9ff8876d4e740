"""Checkpoints of format version 1, which fused W_q, W_k and W_v into one `qkv` weight: their
weights load (trainer/checkpoint.py's `read`, for sampling and evaluation); their optimizer state
cannot be resumed (trainer/resume.py refuses it).
"""


def unfuse_qkv(weights: dict) -> dict:
    """Version 1's model weights with each fused `attn.qkv` (rows q, then k, then v) split
    into `attn.q_proj`, `attn.k_proj`, `attn.v_proj`."""
    out = {}
    for name, tensor in weights.items():
        prefix, dot, kind = name.rpartition(".qkv.")
        if not dot:
            out[name] = tensor
            continue
        for proj, part in zip(("q_proj", "k_proj", "v_proj"), tensor.chunk(3, dim=0)):
            out[f"{prefix}.{proj}.{kind}"] = part.clone()
    return out
