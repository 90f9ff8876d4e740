"""Evaluation past the training length (`trainer.eval_lengths`), after the last step.

Text: for each length L, the validation split cut into windows of L tokens, scored token by
token, and the loss by position bucket (1..T0, then doubling: T0+1..2T0, ..., up to L; T0 =
model.block_size). Beside it the sliding-window reference: the same model scoring each token
with only its last T0 tokens of the window visible, the loss it gets by ignoring the extra
context; a length result is read against it. Positions 1..T0 see the same context either way,
so only positions past T0 need the reference's own forwards: one of T0 tokens per scored token.
Every length scores the same tokens: windows of the longest length, each cut into pieces of L.

Lookup (data.task=kv): for each n in the list, data.recall.lookup_set's rows of exactly n pairs:
the accuracy and loss of the answer, and the weight each head of each layer gives the right pair
from the query (the explicit path's last row, from the input hooks of every attention layer).

Memory stays bounded: at most TOKENS_PER_FORWARD tokens go through the model at once (one window
where a window is longer; no length is longer than target_cap), by SDPA (no L x L weights are kept)
unless a soft-cap needs the explicit path.
Rank 0 evaluates alone; the records go to metrics.jsonl (kind "length_eval", one per length),
summary.json ("length_eval", by length) and one terminal line per length.
"""

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from data.config import DataConfig
from data.recall import lookup_set
from model.config import GPTConfig
from model.errors import ConfigError
from model.gpt import GPT, eval_mode
from trainer.build import Run
from trainer.evaluate import window_starts
from trainer.run_dir import RunDir

TOKENS_PER_FORWARD = 8192   # rows x length of one forward: the memory bound at any length
# Text: at most this many targets per length (fewer if trainer.full_eval_tokens says so), an
# even fixed subset of the split: the reference costs a forward of T0 tokens per target.
MAX_TARGETS = 16_384


def target_cap(full_eval_tokens: Optional[int]) -> int:
    """The most targets a length's text evaluation scores: MAX_TARGETS or trainer.full_eval_tokens,
    whichever is smaller."""
    return min(MAX_TARGETS, full_eval_tokens or MAX_TARGETS)


def check_lengths(model_cfg: GPTConfig, data_cfg: DataConfig, lengths: list[int],
                  max_targets: int = MAX_TARGETS, val_tokens: Optional[int] = None) -> None:
    """ConfigError, before any training, unless every length can be evaluated: on text, windows
    of the longest within `max_targets` targets and the `val_tokens` of the validation split."""
    if data_cfg.source == "recall" and data_cfg.task != "kv":
        raise ConfigError(f"trainer.eval_lengths={lengths} is not valid for data.task="
                          f"{data_cfg.task}: its sequences have one length. Evaluate lengths on "
                          "text, or on the lookup task (data.task=kv, where each length is a "
                          "number of pairs), or set trainer.eval_lengths=[].")
    if not all(type(n) is int and n >= 1 for n in lengths):
        raise ConfigError(f"trainer.eval_lengths={lengths} is not valid: list positive "
                          "integers, e.g. [64,256,1024] (tokens per window; pairs for kv).")
    tokens = max(lengths) + (data_cfg.task == "kv" and data_cfg.source == "recall")
    if model_cfg.pos == "learned" and tokens > model_cfg.block_size:
        raise ConfigError(f"trainer.eval_lengths={lengths} asks for sequences of {tokens} "
                          f"tokens, but model.pos=learned has a position table of "
                          f"model.block_size={model_cfg.block_size} rows and nothing past it. "
                          "Train with positions that extrapolate (model.pos=rope or nope) or "
                          f"keep every length within {model_cfg.block_size}.")
    if data_cfg.source == "recall":   # kv: each length is its own generated set of rows
        return
    if max(lengths) > max_targets:   # one window of the longest scores each of its tokens
        raise ConfigError(f"trainer.eval_lengths={lengths}: one window of the longest length "
                          f"scores {max(lengths):,} targets, more than the {max_targets:,} a "
                          f"length's evaluation may score (the smaller of {MAX_TARGETS:,} and "
                          "trainer.full_eval_tokens). Keep every length within "
                          f"{max_targets:,}.")
    if val_tokens is not None and max(lengths) + 1 > val_tokens:
        raise ConfigError(f"trainer.eval_lengths={lengths}: the validation split has "
                          f"{val_tokens:,} tokens, fewer than a window of the longest length "
                          f"and its next token ({max(lengths) + 1:,}). Keep every length within "
                          f"{val_tokens - 1:,}, or validate on a longer split.")


def report_lengths(run: Run, out: RunDir, step: int) -> dict:
    """On rank 0, evaluate every length, log its record (kind "length_eval") and print its line;
    summary.json's fields ({} on the other ranks)."""
    if run.compute.rank != 0:
        return {}
    model, train_cfg, compute = run.state.model, run.config.train_cfg, run.compute
    lengths = sorted(set(train_cfg.eval_lengths))
    with eval_mode(model), fused_attention(model), torch.no_grad():
        if run.data.scores_answers:
            results = [lookup(model, run.config.data_cfg, n, compute.autocast) for n in lengths]
        else:
            results = text_lengths(model, run.data.val, lengths, compute.autocast,
                                   target_cap(train_cfg.full_eval_tokens))
    for n, result in zip(lengths, results):
        out.log({"kind": "length_eval", "step": step, "length": n, **result})
        out.say(describe({"length": n, **result}))
    return {"length_eval": {str(n): result for n, result in zip(lengths, results)}}


def describe(record: dict) -> str:
    """One terminal line for a length record."""
    if "accuracy" in record:
        return (f"lookup at {record['length']:,} pairs: accuracy {record['accuracy']:.4f}, loss "
                f"{record['loss']:.4f}, weight on the right key {record['right_key_weight']:.4f} "
                f"(the best head) over {record['sequences']:,} sequences")
    buckets = ", ".join(f"{name} {b['loss']:.3f}/{b['sliding_loss']:.3f}"
                        for name, b in record["buckets"].items())
    return (f"length {record['length']:,}: loss {record['loss']:.4f} (sliding window "
            f"{record['sliding_loss']:.4f}) over {record['targets']:,} targets; by position, "
            f"loss/sliding: {buckets}")


@contextmanager
def fused_attention(model: GPT) -> Iterator[None]:
    """Every attention layer on SDPA for the block (no statistics are asked), unless a soft-cap
    needs the explicit path; the chosen paths are restored after."""
    blocks = [block.attn for block in model.blocks]
    before = [attn.attn_impl for attn in blocks]
    for attn in blocks:
        attn.attn_impl = "sdpa" if attn.scaling.softcap is None else "explicit"
    try:
        yield
    finally:
        for attn, impl in zip(blocks, before):
            attn.attn_impl = impl


def token_losses(model: GPT, rows: torch.Tensor, autocast: AbstractContextManager) -> torch.Tensor:
    """rows (R, T + 1) of token ids -> (R, T) float64: the loss of token t + 1 given 0..t."""
    out = []
    for chunk in rows.split(max(1, TOKENS_PER_FORWARD // (rows.shape[1] - 1))):
        idx, targets = chunk[:, :-1], chunk[:, 1:]  # (r, T) each
        with autocast:
            _, loss = model(idx, targets, reduction="none")  # (r * T,)
        out.append(loss.double().view(targets.shape))
    return torch.cat(out)


def buckets(length: int, block_size: int) -> list[tuple[int, int]]:
    """Position buckets (first, last), 1-based: 1..T0, then doubling, the last ending at L."""
    edges, hi = [(1, min(block_size, length))], block_size
    while hi < length:
        edges.append((hi + 1, min(2 * hi, length)))
        hi *= 2
    return edges


def text_lengths(model: GPT, tokens, lengths: list[int], autocast: AbstractContextManager,
                 max_targets: int) -> list[dict]:
    """The record fields of each length (module docstring) on windows of the longest, at most
    `max_targets` targets each: lengths that check_lengths accepted."""
    T0, longest = model.config.block_size, max(lengths)
    starts = [s for s in window_starts(len(tokens), longest, max_targets)
              if s + longest + 1 <= len(tokens)]
    windows = torch.from_numpy(np.stack([np.asarray(tokens[s:s + longest + 1], dtype=np.int64)
                                         for s in starts]))  # (W, longest + 1)
    device = next(model.parameters()).device
    windows = windows.to(device)
    reference = sliding_reference(model, windows, T0, autocast)  # (W, longest), past T0 only
    return [length_record(model, windows, reference, n, autocast) for n in lengths]


def sliding_reference(model: GPT, windows: torch.Tensor, block_size: int,
                      autocast: AbstractContextManager) -> torch.Tensor:
    """(W, longest) float64: the loss of each target at offset o >= T0 of its window given only
    the T0 tokens before it (NaN below T0, where a piece's own loss is the reference)."""
    W, longest = windows.shape[0], windows.shape[1] - 1
    reference = torch.full((W, longest), float("nan"), dtype=torch.float64,
                           device=windows.device)
    for w in range(W if longest > block_size else 0):
        # row j: tokens j..j+T0, whose last target is offset o = j + T0 - 1; j >= 1 is o >= T0
        rows = windows[w].unfold(0, block_size + 1, 1)[1:]  # (longest - T0, T0 + 1)
        reference[w, block_size:] = token_losses(model, rows, autocast)[:, -1]
    return reference


def length_record(model: GPT, windows: torch.Tensor, reference: torch.Tensor, length: int,
                  autocast: AbstractContextManager) -> dict:
    """Loss, sliding-window loss and targets of one length, overall and by position bucket."""
    T0, longest = model.config.block_size, windows.shape[1] - 1
    loss_sum = torch.zeros(length, dtype=torch.float64, device=windows.device)  # by position
    ref_sum, count = torch.zeros_like(loss_sum), torch.zeros_like(loss_sum)
    for lo in range(0, longest, length):
        hi = min(lo + length, longest)
        losses = token_losses(model, windows[:, lo:hi + 1], autocast)  # (W, hi - lo)
        ref = torch.where(torch.arange(hi - lo, device=losses.device) < T0, losses,
                          reference[:, lo:hi])  # positions 1..T0 see the same context
        loss_sum[:hi - lo] += losses.sum(0)
        ref_sum[:hi - lo] += ref.sum(0)
        count[:hi - lo] += losses.shape[0]
    record = {"loss": (loss_sum.sum() / count.sum()).item(),
              "sliding_loss": (ref_sum.sum() / count.sum()).item(),
              "targets": int(count.sum().item()), "buckets": {}}
    for first, last in buckets(length, T0):
        part = slice(first - 1, last)
        record["buckets"][f"{first}-{last}"] = {
            "loss": (loss_sum[part].sum() / count[part].sum()).item(),
            "sliding_loss": (ref_sum[part].sum() / count[part].sum()).item(),
            "targets": int(count[part].sum().item())}
    return record


def lookup(model: GPT, data_cfg: DataConfig, pairs: int, autocast: AbstractContextManager
           ) -> dict:
    """Accuracy, loss and the weight on the right key at `pairs` pairs (lookup_set's rows)."""
    inputs, targets, right = (torch.from_numpy(a) for a in lookup_set(data_cfg, pairs))
    device = next(model.parameters()).device
    correct = loss = 0.0
    weight = torch.zeros(len(model.blocks), model.config.n_head, dtype=torch.float64)
    for rows in torch.arange(len(inputs)).split(max(1, TOKENS_PER_FORWARD // (pairs + 1))):
        idx, answer = inputs[rows].to(device), targets[rows, -1].to(device)
        layer_inputs = []
        hooks = [block.attn.register_forward_hook(
            lambda module, args, out, seen=layer_inputs: seen.append(args[0]))
            for block in model.blocks]
        try:
            with autocast:
                logits, _ = model(idx)  # (r, pairs + 1, V)
        finally:
            for hook in hooks:
                hook.remove()
        last = logits[:, -1].float()  # (r, V): the query's prediction
        correct += (last.argmax(-1) == answer).sum().item()
        loss += F.cross_entropy(last, answer, reduction="sum").item()
        for layer, (block, x) in enumerate(zip(model.blocks, layer_inputs)):
            w = query_weights(block.attn, x)  # (r, H, pairs + 1)
            weight[layer] += w[torch.arange(len(rows)), :, right[rows]].double().sum(0).cpu()
    n = len(inputs)
    per_head = (weight / n).tolist()
    return {"accuracy": correct / n, "loss": loss / n, "right_key_weight": max(map(max, per_head)),
            "right_key_weight_heads": per_head, "sequences": n}


def query_weights(attn, x: torch.Tensor) -> torch.Tensor:
    """The attention weights of the last row (the query), (B, H, T), by the explicit path of
    `attn` on its input x (B, T, C): its scale, length factor and soft-cap, causal."""
    q, k, v = attn.split_heads(x)  # (B, H, T, D) each
    if attn.length is not None:  # scaling.length: the last row sees every key, n = T
        q = attn.length(q, None, True)
    q = q[:, :, -1:]  # (B, H, 1, D): the query's row
    return attn.explicit(q, k, v, None)[1][:, :, 0]  # (B, H, 1, T) -> (B, H, T)
