"""Configuration the Jupyter way: the ``SlurmRay`` traitlets configurable, profiles, env overrides.

One place decides what a cluster request means. :func:`resolve_spec` merges, later winning::

    defaults < config (SlurmRay.*) < env (JUPYTER_SLURM_RAY_*) < profile < arguments

and names the source of every field, which ``%slurm_ray config`` prints.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from traitlets import (
    Bool,
    Dict,
    Float,
    Int,
    List,
    TraitError,
    TraitType,
    Unicode,
    Union,
    observe,
    validate,
)
from traitlets.config import Configurable
from traitlets.traitlets import MetaHasTraits

from .elastic.adaptoptions import ADAPT_OPTIONS
from .errors import SpecError
from .spec import FIELD_NAMES, FORMER_NAMES, ClusterSpec, resolve
from .transport import LocalTransport, SSHTransport, Transport

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "ENV_PREFIX",
    "POSITIVE_SETTINGS",
    "PROFILES_FILENAME",
    "SPEC_SETTINGS",
    "Profile",
    "SlurmRay",
    "effective_setting",
    "env_name",
    "find_profile",
    "load_profiles",
    "make_transport",
    "profiles_path",
    "resolve_spec",
]

ENV_PREFIX = "JUPYTER_SLURM_RAY_"
PROFILES_FILENAME = "slurm_ray_profiles.toml"

# The ClusterSpec fields a site or user may preset (the cluster's name is chosen per cluster).
SPEC_SETTINGS: tuple[str, ...] = tuple(name for name in FIELD_NAMES if name != "name")
_SPEC_FIELDS = {f.name: f for f in dataclasses.fields(ClusterSpec)}


# How a setting of each kind is configured: None (the default) means "not set here".
_KINDS: dict[str, Callable[[str], TraitType]] = {
    "text": lambda h: Unicode(None, allow_none=True, help=h),
    "int": lambda h: Int(None, allow_none=True, help=h),
    "float": lambda h: Float(None, allow_none=True, help=h),
    "flag": lambda h: Bool(None, allow_none=True, help=h),
    "text_or_int": lambda h: Union([Unicode(), Int()], default_value=None, allow_none=True, help=h),
    "lines": lambda h: List(Unicode(), default_value=None, allow_none=True, help=h),
    "ints": lambda h: List(Int(), default_value=None, allow_none=True, help=h),
    "mapping": lambda h: Dict(value_trait=Unicode(), default_value=None, allow_none=True, help=h),
    "groups": lambda h: Dict(value_trait=Dict(), default_value=None, allow_none=True, help=h),
}


def _trait(kind: str, help: str) -> TraitType:
    return _KINDS[kind](help).tag(config=True)


def _valid_spec_setting(self: Configurable, proposal: Any) -> Any:
    name, value = proposal["trait"].name, proposal["value"]
    if value is not None:
        try:
            _SPEC_FIELDS[name].metadata["check"](name, value)
        except SpecError as exc:
            raise TraitError(str(exc)) from None
    return value


# A setting's former name is a trait too, checked as the setting is: it warns
# (DeprecationWarning) and sets the setting; a configuration must not give both names.
def _valid_former_setting(self: Configurable, proposal: Any) -> Any:
    former, value = proposal["trait"].name, proposal["value"]
    if value is not None:
        try:
            _SPEC_FIELDS[FORMER_NAMES[former]].metadata["check"](former, value)
        except SpecError as exc:
            raise TraitError(str(exc)) from None
    return value


def _set_by_former_name(self: Configurable, change: Any) -> None:
    former, value = change["name"], change["new"]
    if value is not None:
        name = FORMER_NAMES[former]
        warnings.warn(
            f"SlurmRay.{former} is now named SlurmRay.{name}; {former} is deprecated",
            DeprecationWarning,
            stacklevel=2,
        )
        setattr(self, name, value)


# The ClusterSpec fields a site or user may preset, one trait each, made from the field's own
# declaration in spec/__init__.py (its kind, help and check): a setting is declared once.
_ClusterSettings: Any = MetaHasTraits(
    "_ClusterSettings",
    (Configurable,),
    {
        "__module__": __name__,
        "__doc__": "The cluster settings of SlurmRay, derived from ClusterSpec's fields.",
        "_valid_spec_setting": validate(*SPEC_SETTINGS)(_valid_spec_setting),
        **{
            name: _trait(_SPEC_FIELDS[name].metadata["kind"], _SPEC_FIELDS[name].metadata["help"])
            for name in SPEC_SETTINGS
        },
        # former names of cluster settings: deprecated, each sets its setting
        "_valid_former_setting": validate(*FORMER_NAMES)(_valid_former_setting),
        "_set_by_former_name": observe(*FORMER_NAMES)(_set_by_former_name),
        **{
            former: _trait(
                _SPEC_FIELDS[name].metadata["kind"],
                f"Deprecated: the former name of {name}, which it sets.",
            )
            for former, name in FORMER_NAMES.items()
        },
        # adapt's settings beside its bounds, from their declaration in elastic/adaptoptions.py
        **{
            option.setting: _trait(option.kind, f"{option.help} (default {option.default:g}).")
            for option in ADAPT_OPTIONS
        },
    },
)


# The package's own numeric settings (timeouts, intervals, limits): each must be positive.
POSITIVE_SETTINGS = (
    "connect_timeout",
    "poll_interval",
    "steady_poll_interval",
    "submit_timeout",
    "record_retention_days",
    *(option.setting for option in ADAPT_OPTIONS),
)


class SlurmRay(_ClusterSettings):
    """Site and user defaults of jupyter_slurm_ray (``%config SlurmRay.time = "2:00:00"``).

    Every setting defaults to None, meaning "not set here": ClusterSpec's own default applies
    unless an environment variable, a profile or an argument sets it. The cluster settings
    (partition, time, nodes, …) come from ClusterSpec's fields; these are the package's own.
    """

    # -- this package ---------------------------------------------------------------------
    default_profile = _trait("text", "Profile used when none is named.")
    profiles_file = _trait(
        "text", f"TOML file of profiles (default: <jupyter config dir>/{PROFILES_FILENAME})."
    )
    connect_timeout = _trait(
        "float", "Seconds one Ray Client connect attempt may take (default 30)."
    )
    poll_interval = _trait(
        "float", "Seconds between two Slurm status queries while a change is expected (default 1)."
    )
    steady_poll_interval = _trait(
        "float",
        "Seconds between two Slurm status queries once a cluster is up and nothing moves "
        "(default 15); Slurm's events still arrive within 5 s.",
    )
    submit_timeout = _trait(
        "float",
        "Seconds a job's submission may take (default 60); past it the job is looked up by its "
        "tag and adopted if it was queued.",
    )
    record_retention_days = _trait(
        "float",
        "Days an ended cluster's record is kept before it is forgotten, and after which `gc` "
        "removes its job dir and the packs no job dir names (default 7).",
    )
    allow_local_ray = _trait(
        "flag",
        "Let ray.init() (and Ray's libraries, which call it) start a Ray on this host while no "
        "cluster is connected in this kernel (default False: they raise NoClusterError).",
    )
    # -- where Slurm runs -----------------------------------------------------------------
    login_host = _trait(
        "text", "Login node to reach over SSH; unset means Slurm runs on this machine."
    )
    login_user = _trait("text", "User name on the login node.")
    login_port = _trait("int", "SSH port of the login node.")
    ssh_key = _trait("text", "Private key file for the login node.")
    known_hosts = _trait("text", "known_hosts file that holds the login node's host key.")
    command_prefix = _trait(
        "lines",
        "Run Slurm commands through this argv prefix, e.g. a site wrapper or "
        "['runuser', '-u', 'alice', '--'] (local Slurm only).",
    )
    driver_hosts = _trait(
        "lines",
        "Host name patterns (fnmatch: 'login*') of machines outside Slurm jobs where connect "
        "= 'auto' tries driver mode (the nodes must reach the host; Ray Client otherwise). "
        "Unset: every host ('*'); [] keeps auto to Ray Client outside jobs, e.g. where the "
        "site keeps Ray's daemons off its login nodes. Inside a Slurm job auto tries anyway.",
    )

    def _load_config(self, cfg: Any, section_names: Any = None, traits: Any = None) -> None:
        """Traitlets' loading of a configuration, refusing one that sets a cluster setting
        under both its name and its former name (``FORMER_NAMES``)."""
        mine = self._find_my_config(cfg)
        for former, name in FORMER_NAMES.items():
            if mine.get(former) is not None and mine.get(name) is not None:
                raise TraitError(
                    f"SlurmRay.{former} = {mine[former]!r} and SlurmRay.{name} = "
                    f"{mine[name]!r}: {former} is the former name of {name}; set {name} only "
                    f"(SlurmRay.{former} = None unsets it)"
                )
        super()._load_config(cfg, section_names, traits)

    @validate(*POSITIVE_SETTINGS)
    def _positive_seconds(self, proposal: Any) -> Any:
        value = proposal["value"]
        if value is not None and not value > 0:
            name = proposal["trait"].name
            raise TraitError(f"SlurmRay.{name} = {value!r}: a positive number is required")
        return value

    @validate("login_port")
    def _valid_port(self, proposal: Any) -> Any:
        value = proposal["value"]
        if value is not None and not 1 <= value <= 65535:
            raise TraitError(f"SlurmRay.login_port = {value!r}: a port from 1 to 65535 is required")
        return value


# ----------------------------------------------------------------------------- env overrides

# The package's own numeric settings are parsed here; ClusterSpec's checks parse the others.
_OWN_TRAITS = {
    name: trait
    for name, trait in SlurmRay.class_traits(config=True).items()
    if name not in SPEC_SETTINGS and name not in FORMER_NAMES
}
_FLOATS = frozenset(name for name, trait in _OWN_TRAITS.items() if isinstance(trait, Float))
_INTS = frozenset(name for name, trait in _OWN_TRAITS.items() if isinstance(trait, Int))
_FLAGS = frozenset(name for name, trait in _OWN_TRAITS.items() if isinstance(trait, Bool))
_ARGV_LISTS = frozenset({"command_prefix", "driver_hosts", "extra_sbatch", "ray_start_args"})


def env_name(setting: str) -> str:
    return ENV_PREFIX + setting.upper()


def _from_env(setting: str, text: str) -> Any:
    """A setting's value from its environment variable's text (ClusterSpec parses the rest)."""
    source = env_name(setting)
    try:
        if setting in _ARGV_LISTS:
            return shlex.split(text)
        if setting in ("env", "worker_groups"):
            value = json.loads(text)
            if not isinstance(value, dict):
                raise ValueError("not a JSON object")
            return value
        if setting in _INTS:
            return _checked_own(setting, int(text))
        if setting in _FLOATS:
            return _checked_own(setting, float(text))
        if setting in _FLAGS:
            return _flag(text)
    except (ValueError, TraitError) as exc:
        raise SpecError(setting, text, f"a valid value in {source} ({exc})") from None
    return text


def _flag(text: str) -> bool:
    word = text.lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError("true or false (1/0, yes/no) is allowed")


def _checked_own(setting: str, value: Any) -> Any:
    """``value`` once SlurmRay's own validation of ``setting`` accepts it (TraitError if not)."""
    SlurmRay(**{setting: value})
    return value


def _environment_settings(environ: Mapping[str, str]) -> dict[str, tuple[str, Any]]:
    """Setting -> (source, value) for every JUPYTER_SLURM_RAY_* variable that names a setting."""
    found = {}
    for setting in SlurmRay.class_trait_names(config=True):
        text = environ.get(env_name(setting))
        if text is not None and text.strip():
            found[setting] = (f"env {env_name(setting)}", _from_env(setting, text.strip()))
    return found


def effective_setting(
    name: str, config: SlurmRay | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Any, str]:
    """(value, source) of one SlurmRay setting: env over config, None with source "default"."""
    environ = os.environ if environ is None else environ
    text = environ.get(env_name(name))
    if text is not None and text.strip():
        return _from_env(name, text.strip()), f"env {env_name(name)}"
    value = getattr(config, name) if config is not None else None
    return (value, f"config SlurmRay.{name}") if value is not None else (None, "default")


def adapt_defaults(
    config: SlurmRay | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, float]:
    """adapt's settings where a request leaves them out: ``SlurmRay.adapt_*`` (env over
    config), else their declared defaults; every path that starts adapting uses these."""
    defaults = {}
    for option in ADAPT_OPTIONS:
        value, _ = effective_setting(option.setting, config, environ)
        defaults[option.name] = option.default if value is None else value
    return defaults


# ----------------------------------------------------------------------------- profiles


@dataclasses.dataclass(frozen=True)
class Profile:
    """A named preset of cluster settings from the profiles file."""

    name: str
    settings: dict[str, Any]
    description: str = ""


def profiles_path(config: SlurmRay | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """The profiles file in effect (it may not exist)."""
    value, _ = effective_setting("profiles_file", config, environ)
    if value:
        return Path(os.path.expanduser(value))
    from jupyter_core.paths import jupyter_config_dir

    return Path(jupyter_config_dir()) / PROFILES_FILENAME


def load_profiles(path: Path) -> dict[str, Profile]:
    """Every profile in ``path`` (none when it does not exist); SpecError when malformed."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError("profiles_file", str(path), f"a readable file ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        allowed = f"valid TOML with [profiles.NAME] tables of cluster settings ({exc})"
        raise SpecError("profiles_file", str(path), allowed) from None
    tables = data.get("profiles", {})
    if not isinstance(tables, dict) or set(data) - {"profiles"}:
        allowed = "only [profiles.NAME] tables of cluster settings at the top level"
        raise SpecError("profiles_file", str(path), allowed)
    return {name: _profile(path, name, table) for name, table in tables.items()}


def _profile(path: Path, name: str, table: Any) -> Profile:
    where = f"profile {name} in {path}"
    if not isinstance(table, dict):
        raise SpecError(where, table, "a table of cluster settings")
    settings = dict(table)
    description = settings.pop("description", "")
    for key, value in settings.items():
        if key.replace("-", "_") not in (*SPEC_SETTINGS, *FORMER_NAMES):
            allowed = f"a cluster setting: {', '.join(SPEC_SETTINGS)} (or description)"
            raise SpecError(f"{where}: {key}", value, allowed)
    return Profile(name, settings, str(description))


def find_profile(name: str, config: SlurmRay | None, environ: Mapping[str, str]) -> Profile:
    path = profiles_path(config, environ)
    profiles = load_profiles(path)
    if name not in profiles:
        known = ", ".join(sorted(profiles)) or "none"
        if not path.exists():
            allowed = f"a profile defined in {path}, which does not exist"
        else:
            allowed = f"a profile defined in {path}: {known}"
        raise SpecError("profile", name, allowed)
    return profiles[name]


# ----------------------------------------------------------------------------- resolve


def resolve_spec(
    arguments: Mapping[str, Any] | None = None,
    *,
    profile: str | None = None,
    config: SlurmRay | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[ClusterSpec, dict[str, str]]:
    """The spec a request means, and each field's source ("argument", "profile gpu-small",
    "env JUPYTER_SLURM_RAY_TIME", "config SlurmRay.time" or "default").

    ``profile`` None means the default profile (``SlurmRay.default_profile``), if any.
    """
    environ = os.environ if environ is None else environ
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if config is not None:
        for name in SPEC_SETTINGS:
            value = getattr(config, name)
            if value is not None:
                layers.append((f"config SlurmRay.{name}", {name: value}))
    found = _environment_settings(environ)
    for name, (source, value) in found.items():
        if name in FORMER_NAMES and FORMER_NAMES[name] in found:
            allowed = f"unset: it is the former name of {env_name(FORMER_NAMES[name])}, also set"
            raise SpecError(env_name(name), value, allowed)
        if name in SPEC_SETTINGS or name in FORMER_NAMES:  # a former name warns (spec/__init__.py)
            layers.append((source, {name: value}))
    if profile is None:
        profile, _ = effective_setting("default_profile", config, environ)
    if profile:
        layers.append((f"profile {profile}", find_profile(profile, config, environ).settings))
    if arguments:
        layers.append(("argument", arguments))
    return resolve(layers)


def make_transport(
    config: SlurmRay | None = None, environ: Mapping[str, str] | None = None
) -> Transport:
    """SSHTransport to ``login_host`` when it is set, else LocalTransport (``command_prefix``)."""

    def setting(name: str) -> Any:
        return effective_setting(name, config, environ)[0]

    host = setting("login_host")
    if not host:
        return LocalTransport(setting("command_prefix") or ())
    key = setting("ssh_key")
    known_hosts = setting("known_hosts")
    return SSHTransport(
        host,
        port=setting("login_port"),
        username=setting("login_user"),
        client_keys=[os.path.expanduser(key)] if key else None,
        known_hosts=os.path.expanduser(known_hosts) if known_hosts else (),
    )
