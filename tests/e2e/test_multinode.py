"""A run launched as two nodes: two torchrun launchers on this machine, one process each,
meeting at a c10d rendezvous on 127.0.0.1, as two machines of a cluster would.

Each launcher is an independent command (`torchrun --nnodes=2 --nproc_per_node=1 ...`), so the
global rank comes from the rendezvous, not from the launcher; the test checks that the job
trains, writes exactly one run folder (global rank 0's), and that its losses match a
one-process run of the same config (trained in this process).
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, make_config, records

import train


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_node(args: list[str], port: int, cwd: Path) -> subprocess.Popen:
    """One node's launcher: torchrun with one process, joining the two-node rendezvous."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
               "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
               "--rdzv_id=attnscale-test", "train.py", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_two_node_launch_matches_one_process(tiny, tmp_path):
    args = [*tiny, "trainer.max_steps=6", "trainer.eval_every=3", "trainer.grad_accum=2"]
    train.train(make_config(args), tmp_path / "one")   # and the token cache the nodes read

    port = free_port()
    # The run folder and the token cache are absolute paths, as on a shared filesystem.
    nodes = [launch_node([*args, f"hydra.run.dir={tmp_path}/two"], port, ROOT) for _ in range(2)]
    outputs = [node.communicate(timeout=300) for node in nodes]
    for node, (_, stderr) in zip(nodes, outputs):
        assert node.returncode == 0, stderr

    run_dir = tmp_path / "two"
    info = json.loads((run_dir / "run.json").read_text())
    assert info["world_size"] == 2
    for kind, key in (("train", "loss"), ("eval", "val_loss")):
        one, two = records(tmp_path / "one", kind), records(run_dir, kind)
        assert [r["step"] for r in one] == [r["step"] for r in two]
        assert [r[key] for r in two] == pytest.approx([r[key] for r in one], abs=1e-5)
    # Only global rank 0 writes: no second run folder next to the first, none in the repo.
    assert sorted(p.name for p in tmp_path.iterdir() if (p / "run.json").exists()) == ["one",
                                                                                     "two"]
    assert not (ROOT / ".hydra").exists()
