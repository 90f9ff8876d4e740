"""scripts/bench.py: the --quick run writes well-formed JSON and Markdown with the expected rows,
and the measuring helpers measure what they say. Timings themselves are not checked."""

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model.attention import SCALINGS
from scripts import bench

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20
QUICK_SEQ_LENS = [16, 32]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One `--quick` run on one thread (small tensors: a second thread only adds hand-offs)."""
    out = tmp_path_factory.mktemp("bench")
    cmd = [sys.executable, "scripts/bench.py", "--quick", "--threads", "1",
           "--json", str(out / "bench.json"), "--markdown", str(out / "bench.md")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "bench.json").read_text())
    return result, (out / "bench.md").read_text(), proc.stdout


@pytest.mark.slow
def test_quick_run_records_the_environment(quick):
    result, _, _ = quick
    env = result["env"]
    assert env["device"] == "cpu" and env["torch_threads"] == 1
    assert env["torch"] == torch.__version__
    for key in ("python", "numpy", "cpu", "cpu_count", "loadavg_start", "loadavg_end"):
        assert env[key] not in (None, ""), key
    assert result["command"].startswith("python scripts/bench.py --quick")
    for key in ("matmul", "matmul_end"):  # the peak rate, measured before and after
        assert {m["dtype"] for m in result[key]} == {"fp32", "bf16"}
        assert all(m["flops"] > 0 for m in result[key])


@pytest.mark.slow
def test_quick_run_has_every_attention_row(quick):
    rows = quick[0]["attention"]
    keys = {(r["T"], r["impl"], r["scaling"]) for r in rows}
    assert keys == {(T, impl, s) for T in QUICK_SEQ_LENS for impl in ("explicit", "sdpa")
                    for s in SCALINGS}
    assert len(rows) == len(keys)
    by = {(r["T"], r["impl"], r["scaling"]): r for r in rows}
    for (T, impl, s), r in by.items():
        assert r["ms"] > 0 and r["peak_bytes"] > 0 and r["B"] * T == 64
        assert math.isclose(r["ms"], statistics.median(r["times_ms"]))
        assert math.isclose(r["speedup_vs_explicit"], by[T, "explicit", s]["ms"] / r["ms"])
        assert math.isclose(r["time_vs_sqrt_dk"], r["ms"] / by[T, impl, "sqrt_dk"]["ms"])
        assert math.isclose(r["memory_vs_explicit"],
                            r["peak_bytes"] / by[T, "explicit", s]["peak_bytes"])


@pytest.mark.slow
def test_quick_run_has_step_and_data_rows(quick):
    result = quick[0]
    steps = {(r["config"], r["precision"], r["compile"]): r for r in result["step"]}
    assert set(steps) == {("nanogpt_cpu", p, False) for p in ("fp32", "bf16")}
    cfg = bench.CONFIGS["nanogpt_cpu"]
    for r in steps.values():
        assert math.isclose(r["tokens_per_s"], cfg.batch_size * cfg.block_size / (r["ms"] / 1e3))
        assert 0 < r["mfu"] and r["n_params"] > 0 and len(r["warmup_s"]) == 1
        assert math.isclose(r["speedup_vs_nanogpt"], bench.NANOGPT_CPU_STEP_MS / r["ms"])
    # exactly one precision is what trainer.precision=auto picks for this model
    assert sum(r["is_auto"] for r in steps.values()) == 1
    assert steps["nanogpt_cpu", "fp32", False]["speedup_vs_fp32_eager"] == 1.0
    (data,) = result["data"]
    assert data["config"] == "nanogpt_cpu" and data["fetch_ms"] > 0
    assert math.isclose(data["share_of_fastest_step"], data["fetch_ms"] / data["fastest_step_ms"])
    assert result["sync"]["measured"] is False


@pytest.mark.slow
def test_quick_markdown_tables_are_well_formed(quick):
    result, md, stdout = quick
    assert md.strip() in stdout
    for heading in ("## Peak matmul rate", "## Attention layer", "## Training step",
                    "## Data path", "## Host-device syncs"):
        assert heading in md
    tables = [block for block in md.split("\n\n") if block.startswith("|")]
    assert [len(t.splitlines()) - 2 for t in tables] == [2, 2 * len(SCALINGS), 2, 1]
    for t in tables:
        widths = {line.count("|") for line in t.splitlines()}
        assert len(widths) == 1, t


def test_peak_memory_on_cpu_measures_what_a_call_holds_at_once():
    def one_big():
        x = torch.empty(8 * MIB, dtype=torch.uint8)
        x.fill_(1)
        del x

    def two_at_once_then_one():
        a = torch.empty(2 * MIB, dtype=torch.uint8)
        b = torch.empty(1 * MIB, dtype=torch.uint8)
        del a, b
        torch.empty(1 * MIB, dtype=torch.uint8)

    peaks = bench.peak_memory({"big": one_big, "two": two_at_once_then_one},
                              torch.device("cpu"))
    assert 8 * MIB <= peaks["big"] < 8 * MIB + 64 * 1024
    assert 3 * MIB <= peaks["two"] < 3 * MIB + 64 * 1024


@pytest.mark.parametrize("vocab_size", [65, 300, bench.CONFIGS["gpt2_small"].vocab_size])
def test_bench_corpus_has_exactly_the_requested_vocabulary(tmp_path, vocab_size):
    """Also GPT-2 small's 50,304 ids (the GPU configuration): that many distinct characters."""
    from omegaconf import OmegaConf

    from data.config import DataConfig
    from data.prepare import prepare

    n_chars = max(2_000, vocab_size + 1_000)  # every character at least once
    cfg = bench.compose_config(bench.corpus(tmp_path, n_chars, vocab_size))
    data = prepare(DataConfig(**OmegaConf.to_container(cfg.data, resolve=True)))
    assert data.vocab_size == vocab_size
    assert len(data.train) > n_chars and int(data.train[:].max()) < vocab_size


def test_interleave_rotates_the_order_and_times_every_call():
    order = []
    cases = {name: (lambda name=name: order.append(name)) for name in "abc"}
    times = bench.interleave(cases, rounds=3, per_round=2, device=torch.device("cpu"))
    assert order == list("aabbcc" "bbccaa" "ccaabb")
    assert {k: len(v) for k, v in times.items()} == {"a": 6, "b": 6, "c": 6}
    assert all(t >= 0 for v in times.values() for t in v)


def test_markdown_cells():
    assert bench.cell(None) == "-"
    assert bench.cell(0.12345) == "0.123"
    assert bench.cell(12345.6) == "12,346"
    assert bench.table(["a", "b"], [[1, 2.5]]) == "| a | b |\n|---|---|\n| 1 | 2.5 |"
