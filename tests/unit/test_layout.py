"""The package layout holds (docs/design.md §1): dependencies point one way, no import circle, no
module uses another's private names, and the client library has a method for every RPC."""

from __future__ import annotations

import ast
from pathlib import Path

from holdfast.client.connection import Client
from holdfast.v1 import coordinator_pb2

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("common", "proc", "agent", "coordinator", "enrollment", "client", "cli", "localstack")
# What each part may import besides itself and the generated protos (holdfast.v1).
ALLOWED = {
    "common": set(),
    "proc": set(),
    "agent": {"common", "proc"},
    # ending: how long a killed tree is waited for; the issuer: started beside the coordinator's server
    "coordinator": {"common", "proc.ending", "enrollment.issuer"},
    "enrollment": {"common"},
    "client": {"common", "proc"},
    # store: the etcd channel it waits on; grantdir: a simulated host removes the grant dirs of the
    # namespace it ended
    "localstack": {"common", "coordinator.store", "client.grantdir"},
    "cli": {"common", "proc", "agent", "coordinator", "enrollment", "client", "localstack"},
}


def modules() -> dict[str, ast.Module]:
    found = {}
    for part in PARTS:
        for path in sorted((ROOT / part).glob("*.py")):
            name = f"{part}.{path.stem}" if path.stem != "__init__" else part
            found[name] = ast.parse(path.read_text(), str(path))
    return found


def holdfast_imports(tree: ast.Module) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import of holdfast, wherever it stands."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("holdfast."):
            base = node.module.removeprefix("holdfast.")
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                # `from holdfast.agent import cgroups` takes a module; `... import Client` a name.
                out.append((sub if sub in MODULES or sub.split(".")[0] == "v1" else base, [alias.name]))
        elif isinstance(node, ast.Import):
            out += [(a.name.removeprefix("holdfast."), []) for a in node.names
                    if a.name.startswith("holdfast.")]
    return out


MODULES = modules()


def test_parts_import_only_what_they_may() -> None:
    wrong = []
    for name, tree in MODULES.items():
        part = name.split(".")[0]
        for imported, _ in holdfast_imports(tree):
            target = imported.split(".")[0]
            if target in (part, "v1"):
                continue
            if target not in ALLOWED[part] and imported not in ALLOWED[part]:
                wrong.append(f"{name} imports holdfast.{imported}")
    assert wrong == []


def test_only_the_coordinators_server_and_the_cli_start_the_enrollment_issuer() -> None:
    starts = {name for name, tree in MODULES.items() if not name.startswith("enrollment")
              for imported, _ in holdfast_imports(tree) if imported.startswith("enrollment")}
    assert starts <= {"coordinator.server", "cli.serve_commands"}
    assert "coordinator.server" in starts


def test_no_import_circles() -> None:
    graph = {name: {i for i, _ in holdfast_imports(tree) if i in MODULES and i != name}
             for name, tree in MODULES.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_no_module_uses_another_modules_private_names() -> None:
    wrong = []
    for name, tree in MODULES.items():
        aliases = set()
        for imported, names in holdfast_imports(tree):
            wrong += [f"{name} imports {n} from holdfast.{imported}" for n in names
                      if n.startswith("_") and not n.startswith("__")]
            if imported in MODULES:
                aliases.add(imported.rsplit(".", 1)[-1])
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                wrong.append(f"{name} uses {node.value.id}.{node.attr}")
    assert wrong == []


# Coordinator RPC -> the client library's method; the agent's own two calls are in its registration.
CLIENT_METHOD = {
    "Acquire": "acquire", "Hold": "acquire", "CommitOwner": "commit",
    "RecordProviderHandle": "record_provider_handle",
    "Release": "release", "RequestHandoff": "request_handoff", "FencedPut": "fenced_put",
    "FencedGet": "fenced_get", "GetSession": "get_session", "ListSessions": "list_sessions",
    "WatchSessions": "watch", "ProbeSession": "probe", "Recover": "recover", "ListHosts": "list_hosts",
    "ArchiveSession": "archive", "GetArchivedSession": "archived", "PurgeArchives": "purge_archives",
    "DrainHost": "drain", "RecoverHost": "recover_host", "FenceHost": "fence_host",
    "RestoreEpoch": "restore_epoch",
    "BeginCarry": "begin_carry", "PutCarryChunk": "put_carry_chunk", "CommitCarry": "commit_carry",
    "GetCarry": "get_carry", "RegisterHost": None, "Heartbeat": None,
}


def test_the_client_library_has_a_method_for_every_rpc() -> None:
    service = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"]
    assert {m.name for m in service.methods} == set(CLIENT_METHOD)
    missing = [rpc for rpc, method in CLIENT_METHOD.items()
               if method and not callable(getattr(Client, method, None))]
    assert missing == []


def test_examples_embed_only_the_public_library() -> None:
    """examples/ shows what an embedding runtime writes: names of holdfast.client's __all__, nothing
    of the layer below (Client, Owner, protobuf)."""
    import holdfast.client as public

    wrong = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        for imported, names in holdfast_imports(ast.parse(path.read_text(), str(path))):
            if imported != "client" or not set(names) <= set(public.__all__):
                wrong.append(f"{path.name} imports {names or ''} from holdfast.{imported}")
    assert wrong == []


def test_every_package_of_the_public_library_is_marked_typed() -> None:
    """PEP 561: py.typed beside the public library and everything its hints name, and in the
    wheel's package data, so a type checker reads the hints of an installed copy."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in config["package-data"]["*"]
    typed = ("holdfast.client", "holdfast.common", "holdfast.proc", "holdfast.v1")
    assert [name for name in typed if not (ROOT / config["package-dir"][name] / "py.typed").is_file()] == []
