"""trainer/job.py: stop signals as a flag the loop reads (StopSignal, with a stop that came
before the loop), what a run started on its own does (Job's hooks, and train.train's use of
them), and the command that resumes it (trainer/resume.py's run_command). A sweep job's hooks
(trainer/launch.py's SweepJob) are tested in tests/e2e/test_launchers.py."""

import json
import os
import shlex
import signal

import pytest
from conftest import derive, records
from hydra.core.override_parser.overrides_parser import OverridesParser

import train
from trainer import checkpoint_read
from trainer.job import STOPS, Interrupted, Job, StopSignal
from trainer.resume import hydra_quoted, python_launcher, run_command

# runs here skip the flushes to disk (conftest.no_fsync)
pytestmark = pytest.mark.usefixtures("no_fsync")


def handlers(signals) -> dict:
    return {s: signal.getsignal(s) for s in signals}


# ---------------------------------------------------------------- StopSignal

def test_a_stop_signal_becomes_a_flag_and_the_handlers_come_back():
    before = handlers(STOPS)
    with StopSignal() as stop:
        assert stop.signum == 0
        assert all(signal.getsignal(s) == stop.handle for s in STOPS)
        os.kill(os.getpid(), signal.SIGTERM)   # delivered before the next line runs
        assert stop.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)   # a second SIGTERM changes nothing
        assert stop.signum == signal.SIGTERM
    assert handlers(STOPS) == before


@pytest.mark.parametrize("first", STOPS)
def test_sigint_after_a_stop_aborts(first):
    before = handlers(STOPS)
    with pytest.raises(KeyboardInterrupt):
        with StopSignal() as stop:
            os.kill(os.getpid(), first)
            assert stop.signum == first
            os.kill(os.getpid(), signal.SIGINT)
    assert handlers(STOPS) == before   # restored on the way out too


def test_a_stop_before_the_loop_counts():
    with pytest.raises(KeyboardInterrupt):
        with StopSignal(before=signal.SIGTERM) as stop:
            assert stop.signum == signal.SIGTERM   # the loop stops after its first step
            os.kill(os.getpid(), signal.SIGINT)    # ... and a SIGINT now is the second: abort


def test_a_stop_before_the_loop_is_kept_over_a_later_one():
    with StopSignal(before=signal.SIGINT) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signum == signal.SIGINT


def test_only_the_given_signals_are_handled():
    before = handlers([*STOPS, signal.SIGUSR1])
    with StopSignal(signals=[signal.SIGUSR1]) as stop:
        assert handlers(STOPS) == {s: before[s] for s in STOPS}
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.signum == signal.SIGUSR1
    assert handlers([*STOPS, signal.SIGUSR1]) == before


# ---------------------------------------------------------------- Job: a run on its own

def test_a_job_on_its_own_has_the_plain_defaults(tmp_path):
    job = Job()
    assert (job.overrides, job.hydra_overrides) == ([], [])
    given = ("scaling=none",)
    job = Job(given, ("hydra.run.dir=x",))
    assert job.overrides == ["scaling=none"] and job.hydra_overrides == ["hydra.run.dir=x"]
    assert tuple(job.stop_signals()) == STOPS == (signal.SIGINT, signal.SIGTERM)
    assert job.stopped_before_loop() == 0 and job.jobs_at_once() is None
    # a folder holding only Hydra's .hydra/ stays (a sweep job's would be removed)
    (tmp_path / ".hydra").mkdir()
    assert job.skip_if_stopped(tmp_path) is None and os.listdir(tmp_path) == [".hydra"]
    before = handlers(STOPS)
    assert job.after_stop(signal.SIGTERM, "auto") is None and handlers(STOPS) == before
    for code in (2, 3, 128 + signal.SIGTERM):
        with pytest.raises(SystemExit) as exit_:
            job.end(code, tmp_path)
        assert exit_.value.code == code


def test_job_resume_command_repeats_its_overrides(tmp_path):
    run_dir = tmp_path / "run"
    job = Job(["scaling=none", "trainer.seed=1", "trainer.resume=auto"],
              ["hydra.run.dir=somewhere", "hydra.job.name=x"])
    ((what, command),) = job.resume_commands(run_dir, 1, "train.py")
    assert what == "this run"
    assert shlex.split(command) == [
        "python", "train.py", "scaling=none", "trainer.seed=1", "hydra.job.name=x",
        "trainer.resume=auto", "hydra.mode=RUN", "hydra.output_subdir=null",
        f'hydra.run.dir="{run_dir}"']
    ((_, command),) = job.resume_commands(run_dir, 2, "train.py")
    assert shlex.split(command)[:4] == ["torchrun", "--standalone", "--nproc_per_node=2",
                                        "train.py"]
    assert command == run_command(run_dir, 2, "train.py", [*job.overrides,
                                                            *job.hydra_overrides])


def test_train_uses_the_jobs_hooks(tiny_cfg, tmp_path, capsys, single_thread):
    """train.train(cfg, run_dir, job): the job's stop before the loop stops it after step 1
    (last.pt written, the segment ended as interrupted), its jobs_at_once sets the threads of
    trainer.threads=auto, its overrides go into run.json."""
    class Hooks(Job):
        def stopped_before_loop(self):
            return signal.SIGTERM

        def jobs_at_once(self):
            return 2

    run_dir = tmp_path / "run"
    job = Hooks(["trainer.seed=1337"], ["hydra.run.dir=x"])
    with pytest.raises(Interrupted) as stop:
        train.train(derive(tiny_cfg, ["trainer.threads=auto"]), run_dir, job)
    assert (stop.value.signum, stop.value.step) == (signal.SIGTERM, 1)
    assert checkpoint_read.read(stop.value.checkpoint)["step"] == 1
    assert [r["step"] for r in records(run_dir, "train")] == [1]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["overrides"] == ["trainer.seed=1337"]
    assert run["segments"][-1]["ended"] == "interrupted"
    assert "/ 2 sweep job(s) at once (hydra.launcher.n_jobs)" in capsys.readouterr().out


# ---------------------------------------------------------------- resume.run_command

OWN = ["trainer.resume=auto", "hydra.mode=MULTIRUN", "hydra.run.dir=old",
       "hydra.sweep.dir=multirun/x", "hydra.sweep.subdir=${hydra.job.num}",
       "hydra.sweeper.params.scaling=a,b", "hydra.output_subdir=.hydra",
       "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]


def test_run_command_drops_what_it_sets_and_the_launcher(tmp_path):
    """A parallel sweep's job resumes alone: no launcher, no sweep folder, hydra.mode=RUN."""
    command = run_command(tmp_path / "job", 1, "train.py",
                          ["scaling=none", "trainer.seed=1", *OWN])
    job = shlex.split(command)
    assert job[:2] == ["python", "train.py"] and "scaling=none" in job
    assert not [a for a in job if "launcher" in a or a.startswith("hydra.sweep")]
    assert job[2:] == ["scaling=none", "trainer.seed=1", "trainer.resume=auto", "hydra.mode=RUN",
                       "hydra.output_subdir=null", f'hydra.run.dir="{tmp_path / "job"}"']


@pytest.mark.parametrize("name", ["scaling=none,trainer.seed=1", 'a "quoted" name',
                                  "back\\slash and space", "optim.lr=1e-3,model=[a,b]"])
def test_the_run_folder_reads_back_through_hydra(tmp_path, name):
    """A sweep job's folder is named by its overrides (`=`, `,`): the printed hydra.run.dir
    must give Hydra that folder back, through the shell."""
    run_dir = tmp_path / name
    arg = shlex.split(run_command(run_dir, 1, "train.py", []))[-1]
    assert arg.startswith("hydra.run.dir=")
    assert OverridesParser.create().parse_override(arg).value() == str(run_dir)


def test_a_folder_inside_the_working_directory_is_shown_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    command = run_command(tmp_path / "outputs" / "a", 1, "train.py", [])
    assert shlex.split(command)[-1] == 'hydra.run.dir="outputs/a"'


def test_hydra_quoted_escapes_quotes_and_the_backslashes_before_them():
    # Hydra reads a backslash as an escape only before a quote or the closing quote
    assert hydra_quoted('x"y\\z') == '"x\\"y\\z"'
    assert hydra_quoted("end\\") == '"end\\\\"'
    assert hydra_quoted('a\\"b') == '"a\\\\\\"b"'
    for value in ('x"y\\z', "end\\", 'a\\"b', "a=b,c", ""):
        override = OverridesParser.create().parse_override(f"k={hydra_quoted(value)}")
        assert override.value() == value


def test_python_or_torchrun():
    assert python_launcher("train.py", 1) == ["python", "train.py"]
    assert python_launcher("t.py", 4) == ["torchrun", "--standalone", "--nproc_per_node=4",
                                          "t.py"]
