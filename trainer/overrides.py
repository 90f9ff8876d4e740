"""The check of a command line's config-group overrides (`scaling=foo`, `data=`): a clear error
naming the group's options where Hydra's own message names neither. train.py's `main` runs
exit_on_bad_groups when the command line has overrides.
"""

import sys
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob
from hydra.errors import HydraException

from model.errors import ConfigError

HYDRA_GROUPS = ("hydra/launcher",)   # Hydra's own groups whose options a user picks
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def group_options(group: str, config_dir: Path = CONFIGS) -> list[str]:
    """The options of a config group: its files in configs/<group>/; for hydra/launcher also
    Hydra's own serial launcher, `basic` (the repository's files name the plugins' launchers)."""
    files = sorted(p.stem for p in (config_dir / group).glob("*.yaml"))
    return (["basic"] if group == "hydra/launcher" else []) + files


def check_group_overrides(args: list[str], config_dir: Path = CONFIGS) -> None:
    """ConfigError naming the group and its options for an override that gives a config group
    (configs/<group>/, hydra/launcher) null, an empty value or an option it does not have, each
    value of a sweep included; Hydra's own message names neither. Deletions (`~group`), globs
    and interpolations are left to Hydra."""
    groups = {*(p.name for p in config_dir.iterdir() if p.is_dir() and p.name != "hydra"),
              *HYDRA_GROUPS}
    parser = OverridesParser.create()
    for arg in args:
        try:
            override = parser.parse_override(arg)
        except HydraException:   # not an override Hydra can read: its own message says why
            continue
        group = override.key_or_group
        if group not in groups or override.is_delete() or isinstance(override.value(), Glob):
            continue   # a glob is matched against the options by Hydra itself
        value = override.value()   # a sweep: its ChoiceSweep or RangeSweep
        values = (list(override.sweep_iterator()) if override.is_sweep_override()
                  else value if isinstance(value, list) else [value])
        options = group_options(group, config_dir)
        for value in values:
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


def exit_on_bad_groups(args: list[str]) -> None:
    """check_group_overrides for train.py's command line: a bad one prints and exits with 2."""
    try:
        check_group_overrides(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
