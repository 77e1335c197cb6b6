"""The etcd keyspace in docs/design.md §3 is the one `coordinator/keys.py` builds, and no coordinator
module spells a key kind outside keys.py (a key spelled twice drifts apart unseen)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from holdfast.coordinator import keys

ROOT = Path(__file__).resolve().parents[2]


class Prefixed:
    def key(self, *parts: str) -> str:
        return "/p/" + "/".join(parts)


def documented_kinds() -> set[str]:
    section = (ROOT / "docs" / "design.md").read_text().split("## 3.", 1)[1].split("\n## ", 1)[0]
    listing = section.split("Keys under a prefix", 1)[1].split("Values are protobuf JSON", 1)[0]
    spelled = re.findall(r"`([^`]+)`", listing)
    return {key.split("/")[0] for key in spelled if not key.startswith("/") and "." not in key}


def test_design_lists_every_key_kind_and_no_other() -> None:
    assert documented_kinds() == set(keys.KINDS)
    assert len(keys.KINDS) == len(set(keys.KINDS))


def test_only_keys_py_builds_keys_from_literals() -> None:
    wrong = []
    for path in sorted((ROOT / "coordinator").glob("*.py")):
        if path.name == "keys.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "key" and node.args
                    and isinstance(node.args[0], ast.Constant)):
                wrong.append(f"{path.name}:{node.lineno}")
    assert wrong == [], "build keys with holdfast.coordinator.keys"


def test_prefixes_end_in_a_separator() -> None:
    store = Prefixed()
    prefixes = [keys.sessions_prefix(store), keys.hosts_prefix(store), keys.history_prefix(store, "s"),
                keys.data_prefix(store, "s"), keys.ops_prefix(store, "s"), keys.archives_prefix(store),
                keys.archive_history_prefix(store, "s"), keys.draining_prefix(store),
                keys.carry_prefix(store, "s"), keys.carry_chunks_prefix(store, "s", 0),
                keys.carry_tenant_budgets_prefix(store), keys.restore_host_off_prefix(store)]
    assert all(p.endswith("/") for p in prefixes)


def test_a_tenant_budget_key_stays_under_its_prefix() -> None:
    assert keys.carry_tenant_budget(Prefixed(), "team-a") == "/p/carry-budget/team-a"
    for hostile in ("", "../sessions/x", "a/b", "Team-A", "*"):
        with pytest.raises(ValueError):
            keys.carry_tenant_budget(Prefixed(), hostile)
