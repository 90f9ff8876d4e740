"""trainer.threads: auto (the available cores, capped, and how idle threads wait), an explicit
number, or null."""

import os

import pytest
import torch
from conftest import derive, make_config

import train
from model.errors import ConfigError
from trainer.build import MAX_AUTO_THREADS, choose_threads
from trainer.schema import TrainerConfig

# runs here skip the flushes to disk (conftest.no_fsync)
pytestmark = pytest.mark.usefixtures("no_fsync")


@pytest.fixture
def cores(monkeypatch):
    """Pretend this process may run on n CPUs, with no OMP_NUM_THREADS and no torchrun."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)

    def set_cores(n: int):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)))
    return set_cores


@pytest.mark.parametrize("n, expected", [(1, 1), (3, 3), (MAX_AUTO_THREADS, MAX_AUTO_THREADS),
                                         (64, MAX_AUTO_THREADS)])
def test_auto_uses_the_available_cores_up_to_the_cap(cores, n, expected):
    cores(n)
    assert choose_threads("auto")[0] == expected


def test_auto_shares_the_cores_among_torchrun_processes(cores, monkeypatch):
    cores(6)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert choose_threads("auto")[0] == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "12")
    assert choose_threads("auto")[0] == 1


def test_auto_follows_omp_num_threads_when_set(cores, monkeypatch):
    cores(16)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert choose_threads("auto")[0] == 2


def test_explicit_counts_and_null_are_kept():
    assert choose_threads(3)[0] == 3 and choose_threads(None)[0] is None


@pytest.mark.parametrize("bad", ["many", 0, -1, True, 1.5])
def test_bad_thread_settings_are_refused(bad):
    with pytest.raises(ConfigError, match="trainer.threads"):
        TrainerConfig(threads=bad)


def test_auto_records_how_idle_threads_wait(cores, monkeypatch):
    """train.py sets OMP_WAIT_POLICY=PASSIVE before torch loads OpenMP (the process itself:
    tests/e2e/test_train_cli.py); auto's line says which policy the run has."""
    cores(2)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert choose_threads("auto") == (2, "trainer.threads=auto: 2 core(s) available, at most "
                                         f"{MAX_AUTO_THREADS}; OMP_WAIT_POLICY=PASSIVE")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert choose_threads("auto")[1].endswith("OMP_NUM_THREADS=3; OMP_WAIT_POLICY=PASSIVE")
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert choose_threads("auto")[1].endswith("; OMP_WAIT_POLICY=unset")


def test_auto_is_the_default_and_is_printed(tiny_cfg, tmp_path, cores, capsys,
                                            single_thread, monkeypatch):
    assert make_config([]).trainer.threads == "auto"
    cores(1)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    # tiny_cfg sets trainer.threads=1: back to the default
    train.train(derive(tiny_cfg, ["trainer.threads=auto", "trainer.max_steps=1"]),
                tmp_path / "run")
    assert torch.get_num_threads() == 1
    assert ("1 thread(s) (trainer.threads=auto: 1 core(s) available, at most "
            f"{MAX_AUTO_THREADS}; OMP_WAIT_POLICY=PASSIVE)") in capsys.readouterr().out
