"""The check of a command line's overrides before Hydra composes: a config group given null, an
empty value, an option it does not have or a list (`scaling=foo`, `data=`, `normaliser=[a,b]`),
and a key that no group has (`+trainer.foo=1`, `+model.normaliser=sink`), each named in one
paragraph with what to write instead, where Hydra's own message names neither (or suggests `+`,
which adds a key that the run then cannot use). train.py's `main` runs exit_on_bad_overrides
when the command line has overrides.
"""

import difflib
import sys
from dataclasses import fields
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob, Override
from hydra.errors import HydraException

from model.errors import ConfigError
from trainer.schema import group_schemas

HYDRA_GROUPS = ("hydra/launcher",)   # Hydra's own groups whose options a user picks
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def group_options(group: str, config_dir: Path = CONFIGS) -> list[str]:
    """The options of a config group: its files in configs/<group>/; for hydra/launcher also
    Hydra's own serial launcher, `basic` (the repository's files name the plugins' launchers)."""
    files = sorted(p.stem for p in (config_dir / group).glob("*.yaml"))
    return (["basic"] if group == "hydra/launcher" else []) + files


def config_groups(config_dir: Path = CONFIGS) -> set[str]:
    return {*(p.name for p in config_dir.iterdir() if p.is_dir() and p.name != "hydra"),
            *HYDRA_GROUPS}


def parsed(args: list[str]) -> list[tuple[str, Override]]:
    """(argument, override) for each argument Hydra can read (its own message says why not)."""
    parser, out = OverridesParser.create(), []
    for arg in args:
        try:
            out.append((arg, parser.parse_override(arg)))
        except HydraException:
            continue
    return out


def check_group_overrides(args: list[str], config_dir: Path = CONFIGS) -> None:
    """ConfigError naming the group and its options for an override that gives a config group
    (configs/<group>/, hydra/launcher) null, an empty value or an option it does not have, each
    value of a sweep included, or a list, which composes its options into one run: only the
    last one's values remain (a sweep is -m). Deletions (`~group`), globs and interpolations
    are left to Hydra."""
    groups = config_groups(config_dir)
    for arg, override in parsed(args):
        group = override.key_or_group
        if group not in groups or override.is_delete() or isinstance(override.value(), Glob):
            continue   # a glob is matched against the options by Hydra itself
        value = override.value()   # a sweep: its ChoiceSweep or RangeSweep
        values = list(override.sweep_iterator()) if override.is_sweep_override() else [value]
        options = group_options(group, config_dir)
        for value in values:
            if isinstance(value, list):
                raise ConfigError(
                    f"{arg}: the config group `{group}` takes one option, and a list trains "
                    f"only the last one's values (here {value[-1] if value else 'none'}). To "
                    f"train each option in a run of its own, sweep with -m: python train.py -m "
                    f"{group}={','.join(map(str, value)) or 'NAME,NAME'}.")
            if not (isinstance(value, str) and (value in options or value.startswith("${"))):
                given = ("an option, not null" if value is None else "an option, not an empty "
                         "value" if value == "" else f"one of its options; {value!r} is not one")
                where = f"the files in configs/{group}/" + (
                    " and Hydra's own serial launcher" if group in HYDRA_GROUPS else "")
                tail = (" Leave experiment out (or write ~experiment) to train without a preset."
                        if group == "experiment" else "")
                raise ConfigError(f"{arg}: the config group `{group}` needs {given}. Its options "
                                  f"({where}): {', '.join(options) or 'none'}; pick one as "
                                  f"{group}=NAME.{tail}")


def check_key_overrides(args: list[str], config_dir: Path = CONFIGS) -> None:
    """ConfigError for an override of a key that the schema (trainer/schema.py) does not have,
    added with `+` or not, naming the key to use: a config group's option
    (`+model.normaliser=sink`: normaliser=sink), the group that has the key (scaling.normaliser),
    a close spelling (trainer.max_steps), or else the group's keys. Hydra's keys (hydra.*),
    deletions and `group@package` overrides are left to Hydra."""
    groups = config_groups(config_dir)
    keys = {group: [f.name for f in fields(schema)] for group, schema in group_schemas().items()}
    for arg, override in parsed(args):
        head, _, rest = override.key_or_group.partition(".")
        name, value = rest.partition(".")[0], arg.partition("=")[2]
        if (head == "hydra" or override.is_delete() or override.package is not None
                or (not rest and head in groups) or name in keys.get(head, ())):
            continue
        if head in keys:
            added = " (`+` adds a key that the run cannot use)" if arg.startswith("+") else ""
            raise ConfigError(f"{arg}: `{head}` has no key `{name}`{added}; "
                              f"{instead(head, name, value, keys, config_dir)}")
        if head in groups:   # a group of options whose files set another group's keys
            raise ConfigError(f"{arg}: `{head}` is a config group, not a group of keys: pick "
                              f"one of its options as {option(head, value, config_dir)}.")
        raise ConfigError(f"{arg}: there is no config group or key `{head}`; the groups of keys "
                          f"are {', '.join(keys)}, set as GROUP.KEY=VALUE.")


def option(group: str, value: str, config_dir: Path) -> str:
    """`group=value` where value is one of the group's options, else the options listed."""
    options = group_options(group, config_dir)
    return (f"{group}={value}" if value in options else
            f"{group}=NAME ({', '.join(options)})")


def instead(head: str, name: str, value: str, keys: dict[str, list[str]],
            config_dir: Path) -> str:
    """What to write for `head.name=value`, a key that the group `head` does not have."""
    uses = [option(name, value, config_dir)] if name in config_groups(config_dir) else []
    uses += [f"{group}.{name}={value}" for group, names in keys.items() if name in names]
    if uses:
        return f"use {' or '.join(uses)}."
    close = difflib.get_close_matches(name, keys[head], n=1)
    return (f"did you mean {head}.{close[0]}?" if close else
            f"its keys are {', '.join(keys[head])}.")


def exit_on_bad_overrides(args: list[str]) -> None:
    """The checks above for train.py's command line: a bad override prints and exits with 2."""
    try:
        check_group_overrides(args)
        check_key_overrides(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
