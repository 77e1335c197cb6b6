"""Configuration precedence (flag > HOLDFAST_* > TOML > default) and errors that name the setting."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from holdfast.cli import agent_commands as commands
from holdfast.cli import serve_commands
from holdfast.common import config


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_flags(parser, commands.SERVE_SETTINGS)
    return parser.parse_args(argv)


def load(argv: list[str], env: dict[str, str], toml: str = "", tmp: Path | None = None) -> argparse.Namespace:
    if toml and tmp is not None:
        path = tmp / "holdfast.toml"
        path.write_text(toml)
        argv = [*argv, "--config", str(path)]
    return config.load(commands.SERVE_SETTINGS, parse(argv), "agent", env)


def test_flag_beats_environment_beats_file_beats_default(tmp_path: Path) -> None:
    toml = '[agent]\nlisten = "127.0.0.1:3"\nhost_id = "from-file"\nlog_format = "text"\nnode = true\n'
    env = {"HOLDFAST_AGENT_LISTEN": "127.0.0.1:2", "HOLDFAST_HOST_ID": "from-env"}
    got = load(["--listen", "127.0.0.1:1"], env, toml, tmp_path)
    assert (got.listen, got.host_id, got.log_format, got.node) == ("127.0.0.1:1", "from-env", "text", True)
    assert got.spawn_token_env == commands.DEFAULT_SPAWN_TOKEN_ENV and got.metrics_listen == ""
    assert load(["--no-node"], env, toml, tmp_path).node is False  # a flag can turn a file's true off


def test_config_file_from_holdfast_config_environment(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[agent]\nlisten = "127.0.0.1:9"\nhost_id = "h"\n[coordinator]\netcd = "x"\n')
    got = config.load(commands.SERVE_SETTINGS, parse([]), "agent", {"HOLDFAST_CONFIG": str(path)})
    assert got.listen == "127.0.0.1:9"  # the other server's table is not this server's business


@pytest.mark.parametrize("env,words", [
    ({"HOLDFAST_AGENT_LISTEN": "nonsense"}, ["listen", "HOLDFAST_AGENT_LISTEN", "host:port"]),
    ({"HOLDFAST_HOST_ID": "bad id!"}, ["host_id", "HOLDFAST_HOST_ID"]),
    ({"HOLDFAST_SPAWN_TOKEN_ENV": "1X"}, ["spawn_token_env", "environment variable name"]),
    ({"HOLDFAST_LOG_FORMAT": "xml"}, ["log_format", "json, text"]),
    ({"HOLDFAST_NODE": "maybe"}, ["node", "boolean"]),
    ({"HOLDFAST_AGENT_METRICS_LISTEN": "127.0.0.1:70000"}, ["metrics_listen"]),
    ({"HOLDFAST_REGISTRATION_TTL": "1"}, ["registration_ttl", "2..60"]),
    ({"HOLDFAST_REGISTRATION_TTL": "ten"}, ["registration_ttl", "not an integer"]),
])
def test_a_wrong_environment_value_names_setting_and_source(env: dict[str, str], words: list[str]) -> None:
    base = {"HOLDFAST_AGENT_LISTEN": "127.0.0.1:0", "HOLDFAST_HOST_ID": "h", **env}
    with pytest.raises(config.ConfigError) as err:
        load([], base)
    for word in words:
        assert word in str(err.value)


def test_file_errors_name_the_key_or_the_file(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match=r"setting listen \(from .* key listen\)"):
        load([], {"HOLDFAST_HOST_ID": "h"}, "[agent]\nlisten = 7601\n", tmp_path)
    with pytest.raises(config.ConfigError, match="unknown setting 'lisen'"):
        load([], {}, '[agent]\nlisen = "127.0.0.1:1"\n', tmp_path)
    with pytest.raises(config.ConfigError, match="not valid TOML"):
        load([], {}, "[agent\n", tmp_path)
    with pytest.raises(config.ConfigError, match="No such file"):
        load(["--config", str(tmp_path / "missing.toml")], {})


def test_missing_required_setting_says_every_way_to_give_it() -> None:
    with pytest.raises(config.ConfigError) as err:
        load(["--listen", "127.0.0.1:0"], {})
    assert all(w in str(err.value) for w in ("host_id", "--host-id", "HOLDFAST_HOST_ID"))


def test_coordinator_settings_validate_etcd_prefix_and_census() -> None:
    parser = argparse.ArgumentParser()
    config.add_flags(parser, serve_commands.SETTINGS)
    ok = {"HOLDFAST_ETCD": "http://127.0.0.1:2379", "HOLDFAST_COORDINATOR_LISTEN": "127.0.0.1:0"}
    got = config.load(serve_commands.SETTINGS, parser.parse_args([]), "coordinator", ok)
    assert got.prefix == "/holdfast/v1/" and got.census_seconds == 15.0
    for name, value in (("HOLDFAST_ETCD", "http://nohost"), ("HOLDFAST_ETCD_PREFIX", "holdfast"),
                        ("HOLDFAST_CENSUS_SECONDS", "0")):
        with pytest.raises(config.ConfigError, match=name):
            config.load(serve_commands.SETTINGS, parser.parse_args([]), "coordinator", {**ok, name: value})


def _documented() -> dict[tuple[str, str], str]:
    """(server, setting) → env from the table in docs/operations.md."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0] in ("agent", "coordinator", "agent, doctor", "both"):
            rows[(cells[0], cells[1])] = cells[3]
    return rows


def test_the_documented_table_lists_every_setting_with_its_variable() -> None:
    rows = _documented()
    for server, settings in (("agent", commands.SERVE_SETTINGS), ("coordinator", serve_commands.SETTINGS)):
        for s in settings:
            keys = ((server, s.name), ("agent, doctor", s.name), ("both", s.name))
            key = next(k for k in keys if k in rows)
            assert rows[key] == s.env, (server, s.name)
