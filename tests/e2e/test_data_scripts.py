"""Processes of the data layer: scripts/prepare_data.py's and scripts/baselines.py's exit codes
and error lines, what a fresh interpreter imports to prepare data, and `python train.py`'s exit
code for a recall task whose block differs from its sequences. (Moved from tests/data/: the
settings, the caches and the runs themselves are tested there in process.)"""

import os
import subprocess
import sys

import pytest
from conftest import ROOT

SCRIPTS = ROOT / "scripts"


def test_prepare_data_fails_cleanly(tmp_path):
    for bad, needle in ((["data.nosuchkey=1"], "nosuchkey"),
                        (["data.shard_tokens=abc"], "shard_tokens"),
                        (["data=text"], "train_files")):
        proc = subprocess.run([sys.executable, str(SCRIPTS / "prepare_data.py"), *bad],
                              capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 2 and needle in proc.stderr, (bad, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("script", ["prepare_data.py", "baselines.py"])
def test_a_generated_task_has_no_corpus_to_prepare_or_score(tmp_path, script):
    proc = subprocess.run([sys.executable, str(SCRIPTS / script), "data=recall"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: data=recall is generated on the fly, not a corpus")
    assert proc.stderr.count("\n") == 1


def test_preparing_data_imports_no_model_code():
    """Preparing a cache (scripts/prepare_data.py) needs only the error types of model/;
    batching takes IGNORE_INDEX from model/config.py."""
    code = ("import sys, data.prepare, data.sources; "
            "print(sorted(m for m in sys.modules if m == 'model' or m.startswith('model.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert out.strip() == "['model', 'model.errors']"


def test_a_recall_block_that_is_not_the_sequence_exits_2(tmp_path):
    """model=tiny's block_size 64 is not data.seq_len 96: exit 2 before the run dir is made
    (tests/data/test_data_recall.py checks the error of train.train in process)."""
    bad = subprocess.run([sys.executable, "train.py", "data=recall", "model=tiny",
                          f"hydra.run.dir={tmp_path / 'bad'}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert bad.returncode == 2 and "data.seq_len" in bad.stderr and not (tmp_path / "bad").exists()
