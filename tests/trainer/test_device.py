"""pick_device: a device name this machine cannot give is refused with the setting's name, before
anything runs; scripts/bench.py names its own --device."""
import pytest
import torch

from model.errors import UserError
from scripts import bench
from trainer.build import pick_device


def test_cpu_is_cpu():
    assert pick_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name", ["cpu:x", "cuda:abc", "cuda:-1"])
def test_a_malformed_name_is_refused(name, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(UserError, match=rf"trainer.device={name} is not a device; use "
                                        r"trainer.device=auto, cpu, cuda, cuda:N or mps."):
        pick_device(name)


def test_a_gpu_index_past_the_count_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(UserError, match=r"^trainer.device=cuda:2: this machine has 2 GPU\(s\), "
                                        r"numbered from 0; use trainer.device=cuda or a smaller "
                                        r"index.$"):
        pick_device("cuda:2")


def test_bench_names_its_own_option(tmp_path, capsys):
    absent = "cuda" if not torch.cuda.is_available() else "cuda:99"
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--quick", "--device", absent, "--json", str(tmp_path / "b.json")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bench.py: error: --device={absent}") and "trainer." not in err
    assert not list(tmp_path.iterdir())
