"""scripts/bench_threads.py on the tiny corpus: runs started alone and together, each one's
tokens/s from its summary.json and its threads from its start line, in a table and a JSON file.
Timings themselves are not checked."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, tiny_overrides

from trainer.build import MAX_AUTO_THREADS

pytestmark = pytest.mark.slow


def test_runs_alone_and_together_and_records_what_auto_chose(tmp_path):
    """trainer.threads=auto's runs, one alone and two together, on the tiny corpus."""
    out = tmp_path / "threads.json"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    proc = subprocess.run([sys.executable, "scripts/bench_threads.py", "--steps", "2",
                           "--rounds", "1", "--cases", "auto", "--json", str(out),
                           *tiny_overrides(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    cores = len(os.sched_getaffinity(0))
    assert report["cores"] == cores and report["at_once"] == 2
    alone, together = report["results"]["auto"]["alone"], report["results"]["auto"]["at_once"]
    assert [len(runs) for runs in alone + together] == [1, 2]
    threads = str(min(cores, MAX_AUTO_THREADS))   # the bench's threads win over tiny's 1
    for run in alone[0] + together[0]:
        assert run["tokens_per_sec"] > 0 and run["threads"] == threads
        assert f"at most {MAX_AUTO_THREADS}; OMP_WAIT_POLICY=PASSIVE)" in run["start_line"]
    assert "| auto | " in proc.stdout and f" | {threads} | " in proc.stdout
