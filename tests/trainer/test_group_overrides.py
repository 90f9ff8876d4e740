"""A config group given null, an empty value, an option it does not have or a list is named, with
its options, before Hydra composes (trainer.overrides.check_group_overrides), as is a key that no
group has (check_key_overrides), and train.py's entry exits 2 with that one paragraph and no
traceback (the command line itself: tests/e2e/test_train_cli.py)."""

import dataclasses
import sys
from pathlib import Path

import pytest
from conftest import CONFIGS

from model.errors import ConfigError
from trainer.overrides import check_group_overrides, check_key_overrides
from trainer.schema import group_schemas

# every group a user picks an option of; hydra/launcher's options come from Hydra's plugins too
GROUPS = ("scaling", "model", "data", "optim", "trainer", "logger", "experiment",
          "hydra/launcher")


def options(group: str) -> list[str]:
    """The options of `group` as the files say (hydra/launcher: Hydra's `basic` at least)."""
    files = sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))
    return files if group != "hydra/launcher" else sorted({*files, "basic"})


def check(*args: str) -> None:
    check_group_overrides(list(args))


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("value, says", [("null", "not null"), ("", "not an empty value"),
                                         ("bogus", "'bogus' is not one")])
def test_a_bad_value_names_the_group_and_every_option(group, value, says):
    with pytest.raises(ConfigError) as err:
        check("trainer.max_steps=3", f"{group}={value}")
    message = str(err.value)
    assert message.startswith(f"{group}={value}: the config group `{group}` needs ")
    assert says in message and f"configs/{group}/" in message
    listed = message.split("): ", 1)[1].split(";")[0].split(", ")
    assert set(options(group)) <= set(listed)
    if group != "hydra/launcher":   # plugins add options that no file in configs/ names
        assert listed == options(group)


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_of_every_group_passes(group):
    for option in options(group):
        check(f"{group}={option}")
    check(f"{group}={','.join(options(group))}")   # a sweep over all of them


@pytest.mark.parametrize("arg", ["scaling=sqrt_dk,bogus", "model=[tiny,bogus]",
                                 "scaling=choice(none,bogus)", "+logger=bogus",
                                 "scaling@attn=null", "data=null,text"])
def test_each_value_of_a_sweep_or_list_is_checked(arg):
    with pytest.raises(ConfigError, match="the config group"):
        check(arg)


@pytest.mark.parametrize("arg", ["~experiment", "model.n_head=3", "trainer.resume=null",
                                 "scaling=glob(*)", "logger.mode=online",
                                 "hydra.run.dir=x=y", "scaling=${oc.env:SCALING}"])
def test_deletions_keys_globs_and_interpolations_are_left_to_hydra(arg):
    check(arg)


def test_the_options_are_read_from_the_folder(tmp_path):
    configs = tmp_path / "configs"
    for name in ("alpha", "beta"):
        (configs / "widget").mkdir(parents=True, exist_ok=True)
        (configs / "widget" / f"{name}.yaml").write_text("{}\n")
    check_group_overrides(["widget=beta"], configs)
    with pytest.raises(ConfigError, match=r"\(the files in configs/widget/\): alpha, beta;"):
        check_group_overrides(["widget=gamma"], configs)


@pytest.mark.parametrize("group, value", list(zip(GROUPS, ["null", "", "bogus"] * 3)))
def test_train_py_exits_2_with_one_paragraph(group, value, tmp_path, monkeypatch, capsys):
    """train.py's entry (main), in this process: it exits before Hydra starts (the command
    line's exit code: tests/e2e/test_train_cli.py)."""
    import train
    run_dir = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["train.py", f"{group}={value}", f"hydra.run.dir={run_dir}"])
    with pytest.raises(SystemExit) as exit_:
        train.main()
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith(f"error: {group}={value}: the config group `{group}` needs ")
    assert ", ".join(options(group)[:2]) in lines[0] or group == "hydra/launcher"
    assert not Path(run_dir).exists() and out == ""


@pytest.mark.parametrize("arg, last, sweep", [
    ("normaliser=[sink,sigmoid]", "sigmoid", "normaliser=sink,sigmoid"),
    ("scaling=[none,uniform]", "uniform", "scaling=none,uniform"),
    ("+model=[tiny,small]", "small", "model=tiny,small")])
def test_a_list_for_a_group_is_refused_naming_the_sweep(arg, last, sweep):
    """A list composes its options into one run, so only the last one's values would train."""
    with pytest.raises(ConfigError) as err:
        check(arg)
    assert str(err.value) == (
        f"{arg}: the config group `{arg.lstrip('+').split('=')[0]}` takes one option, and a "
        f"list trains only the last one's values (here {last}). To train each option in a run "
        f"of its own, sweep with -m: python train.py -m {sweep}.")


@pytest.mark.parametrize("arg, says", [
    ("+model.normaliser=sink", "`model` has no key `normaliser` (`+` adds a key that the run "
     "cannot use); use normaliser=sink or scaling.normaliser=sink."),
    ("model.normaliser=sink", "`model` has no key `normaliser`; use normaliser=sink or "
     "scaling.normaliser=sink."),
    ("+model.normaliser=bogus", "use normaliser=NAME (sigmoid, sink, softmax, softmax1) or "
     "scaling.normaliser=bogus."),
    ("+normaliser.name=sink", "`normaliser` is a config group, not a group of keys: pick one "
     "of its options as normaliser=sink."),
    ("+trainer.max_step=3", "`trainer` has no key `max_step` (`+` adds a key that the run "
     "cannot use); did you mean trainer.max_steps?"),
    ("+trainer.foo=1", "`trainer` has no key `foo` (`+` adds a key that the run cannot use); "
     "its keys are max_steps, batch_size, "),
    ("+scaling.foo=1", "`scaling` has no key `foo` (`+` adds a key that the run cannot use); "
     "its keys are name, "),
    ("+foo=1", "there is no config group or key `foo`; the groups of keys are model, data, "
     "scaling, param, optim, trainer, logger, set as GROUP.KEY=VALUE.")])
def test_a_key_no_group_has_is_refused_naming_the_key_to_use(arg, says):
    with pytest.raises(ConfigError) as err:
        check_key_overrides([arg])
    message = str(err.value)
    assert message.startswith(f"{arg}: ") and says in message


def test_every_key_of_the_schema_passes():
    """Each key Hydra's schema has (trainer/schema.py), plain, added, forced; Hydra's own keys,
    deletions and packages are left to Hydra."""
    for group, schema in group_schemas().items():
        for f in dataclasses.fields(schema):
            check_key_overrides([f"{group}.{f.name}=1", f"+{group}.{f.name}=1",
                                 f"++{group}.{f.name}=1"])
    check_key_overrides(["hydra.run.dir=x", "~trainer.foo", "scaling@attn=none", "normaliser=sink",
                         "experiment=normaliser", "hydra/launcher=joblib"])


@pytest.mark.parametrize("arg", ["+model.normaliser=sink", "normaliser=[sink,sigmoid]"])
def test_train_py_refuses_a_list_or_a_key_in_one_paragraph(arg, tmp_path, monkeypatch, capsys):
    import train
    run_dir = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["train.py", arg, f"hydra.run.dir={run_dir}"])
    with pytest.raises(SystemExit) as exit_:
        train.main()
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == "" and not run_dir.exists()
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"error: {arg}: ")
