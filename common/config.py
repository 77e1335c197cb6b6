"""Server configuration from flags, the environment (HOLDFAST_*) and a TOML file, in that precedence.

Guarantee: every setting is validated before a server binds anything; a wrong or missing value is a
`ConfigError` naming the setting and where the value came from, so start-up stops (exit 2) instead
of serving with a guess. Shared by `agent serve`, `agent doctor` and `coordinator serve`. The
parsers are pure.
"""

from __future__ import annotations

import argparse
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from holdfast.common import keepalive
from holdfast.common.identifiers import HOST_ID
from holdfast.common.tls import TENANT

CONFIG_ENV = "HOLDFAST_CONFIG"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LOG_FORMATS = ("json", "text")
LOG_LEVELS = ("debug", "info", "warning", "error")
TRUE, FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


class ConfigError(ValueError):
    """A setting that cannot be used; the message names it and its source."""


@dataclass(frozen=True)
class Setting:
    name: str  # the TOML key; the flag is --name with dashes
    env: str
    parse: Callable[[Any], Any]
    help: str
    default: Any = None
    required: bool = False
    boolean: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


# --- value parsers: raw (str from a flag or the environment, or a TOML value) → typed, or ValueError ---
def text(raw: Any) -> str:
    if not isinstance(raw, str):
        raise ValueError(f"must be a string, got {type(raw).__name__}")
    return raw


def address(raw: Any) -> str:
    """host:port with a port in 0..65535 (0 picks a free one)."""
    value = text(raw)
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{value!r} is not host:port (port 0..65535)")
    return value


def optional_address(raw: Any) -> str:
    return address(raw) if text(raw) else ""


def host_id(raw: Any) -> str:
    value = text(raw)
    if not HOST_ID.fullmatch(value):
        raise ValueError(f"{value[:40]!r} must match {HOST_ID.pattern}")
    return value


def tenant(raw: Any) -> str:
    value = text(raw)
    if not TENANT.fullmatch(value):
        raise ValueError(f"{value[:80]!r} is not a tenant: a DNS label ({TENANT.pattern})")
    return value


def env_name(raw: Any) -> str:
    value = text(raw)
    if not ENV_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not an environment variable name")
    return value


def choice(options: Sequence[str]) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        value = text(raw).lower()
        if value not in options:
            raise ValueError(f"{raw!r} is not one of {', '.join(options)}")
        return value

    return parse


def integer_in(low: int, high: int) -> Callable[[Any], int]:
    def parse(raw: Any) -> int:
        try:
            value = raw if isinstance(raw, int) and not isinstance(raw, bool) else int(text(raw))
        except ValueError:
            raise ValueError(f"{raw!r} is not an integer") from None
        if not low <= value <= high:
            raise ValueError(f"{value} is not in {low}..{high}")
        return value

    return parse


def boolean(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    value = text(raw).lower()
    if value in TRUE | FALSE:
        return value in TRUE
    raise ValueError(f"{raw!r} is not a boolean (true/false)")


KEEPALIVE = Setting(
    "keepalive_seconds", keepalive.ENV, integer_in(keepalive.LOWEST_SECONDS, keepalive.HIGHEST_SECONDS),
    "seconds without a frame from a peer before this server pings it while a call is open, its channels "
    "alike (a peer gone without a TCP reset is found within this plus min(this, "
    f"{keepalive.ACK_TIMEOUT_CAP_SECONDS}) s); it accepts pings down to half of it: set it no higher "
    "than its clients' HOLDFAST_KEEPALIVE_SECONDS", default=keepalive.DEFAULT_SECONDS)


def logging_settings() -> list[Setting]:
    return [
        Setting("log_format", "HOLDFAST_LOG_FORMAT", choice(LOG_FORMATS), "json or text", default="json"),
        Setting("log_level", "HOLDFAST_LOG_LEVEL", choice(LOG_LEVELS), "debug, info, warning or error",
                default="info"),
    ]


# --- argparse wiring ------------------------------------------------------------------------------
def add_flags(parser: argparse.ArgumentParser, settings: Sequence[Setting]) -> None:
    """Flags default to None so that `resolve` can tell "not given" from a value."""
    parser.add_argument("--config", metavar="FILE", help=f"TOML file (or {CONFIG_ENV}); flags and "
                        "HOLDFAST_* variables override it")
    for s in settings:
        shown = f" (default {s.default})" if s.default not in (None, "") else ""
        if s.boolean:
            parser.add_argument(s.flag, dest=s.name, action=argparse.BooleanOptionalAction, default=None,
                                help=f"{s.help}; env {s.env}{shown}")
        else:
            parser.add_argument(s.flag, dest=s.name, default=None, help=f"{s.help}; env {s.env}{shown}")


# --- resolution -----------------------------------------------------------------------------------
def read_file(path: str, table: str) -> dict[str, Any]:
    """The server's `[table]` of a TOML file; other top-level tables belong to the other server."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}. Next: fix --config / {CONFIG_ENV}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    section = data.get(table, {})
    if not isinstance(section, dict):
        raise ConfigError(f"config file {path}: [{table}] must be a table")
    return section


def resolve(settings: Sequence[Setting], flags: Mapping[str, Any], env: Mapping[str, str],
            file_values: Mapping[str, Any], file_label: str = "config file") -> dict[str, Any]:
    """Flag, else environment, else file, else default; every value parsed, every key known."""
    known = {s.name for s in settings}
    unknown = sorted(set(file_values) - known)
    if unknown:
        raise ConfigError(f"{file_label}: unknown setting {unknown[0]!r}; known: {', '.join(sorted(known))}")
    values: dict[str, Any] = {}
    for s in settings:
        if flags.get(s.name) is not None:
            raw, source = flags[s.name], s.flag
        elif s.env in env:
            raw, source = env[s.env], s.env
        elif s.name in file_values:
            raw, source = file_values[s.name], f"{file_label} key {s.name}"
        elif s.required:
            raise ConfigError(f"setting {s.name} is required: pass {s.flag}, set {s.env}, or put {s.name} "
                              f"in the {file_label}")
        else:
            values[s.name] = s.default
            continue
        try:
            values[s.name] = s.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"setting {s.name} (from {source}): {exc}") from None
    return values


def load(settings: Sequence[Setting], args: argparse.Namespace, table: str,
         env: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Resolves `settings` for one server from its parsed flags, the environment and --config."""
    env = os.environ if env is None else env
    path = args.config or env.get(CONFIG_ENV, "")
    file_values = read_file(path, table) if path else {}
    flags = {s.name: getattr(args, s.name, None) for s in settings}
    resolved = resolve(settings, flags, env, file_values, f"{path} [{table}]")
    return argparse.Namespace(**{**vars(args), **resolved})
