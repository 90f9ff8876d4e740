"""scripts/bench_data.py --quick: every case builds, then starts from its cache, and the table
carries the numbers docs/benchmarks.md reports."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quick_data_benchmark(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_data.py"), "--quick",
                           "--dir", str(tmp_path), "--documents", "file", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())
    assert [(r["tokenizer"], r["document"]) for r in rows] == [("char", "file"), ("bpe", "file")]
    for r in rows:
        assert 1.9 < r["corpus_mb"] < 2.1 and r["documents"] == 2 and r["reused"]
        assert r["mb_s_after_tokenizer"] > r["mb_s_with_tokenizer"] > 0
        assert 50 < r["peak_rss_mb"] < 2048
        assert 0 <= r["cached_prepare_s"] < r["build_wall_s"]
    char, bpe = rows
    assert char["tokens"] >= 2 * 10**6 > bpe["tokens"]   # one id per character; BPE merges
    assert proc.stdout.count("\n| char | file |") == 1 and "peak RSS MB" in proc.stdout
