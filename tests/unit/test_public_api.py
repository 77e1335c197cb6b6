"""The public library's surface (holdfast.client.__all__) is the one docs/api.md documents, name by
name, each with a docstring and an example; refusals are the typed exception of their reason's
family; what the library is given is checked before anything is asked of anyone."""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import holdfast.client as public
from holdfast.client import BadInput, ClientError, Grant, StaleFence, sync
from holdfast.client.aio import spec_of
from holdfast.client.connection import Client
from holdfast.client.errors import FAMILIES
from holdfast.common import reasons
from holdfast.common.reasons import Family, Reason

ROOT = Path(__file__).resolve().parents[2]
API = (ROOT / "docs" / "api.md").read_text()


def documented() -> dict[str, str]:
    """Each `### `Name`` section of docs/api.md and its text."""
    parts = re.split(r"^### `([A-Za-z_]+)`\s*$", API, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_docs_api_documents_exactly_the_public_names_each_with_an_example() -> None:
    sections = documented()
    assert sorted(sections) == sorted(public.__all__)
    assert [name for name, text in sections.items() if "```python" not in text] == []


def test_every_public_name_and_member_has_a_docstring() -> None:
    missing = []
    for name in public.__all__:
        thing = getattr(public, name)
        if not (thing.__doc__ or "").strip():
            missing.append(name)
        if inspect.isclass(thing) and thing.__module__.startswith("holdfast."):
            missing += [f"{name}.{member}" for member, value in vars(thing).items()
                        if not member.startswith("_") and (callable(value) or isinstance(value, property))
                        and not (getattr(value, "__doc__", None) or "").strip()]
    assert missing == []


def test_every_family_raises_its_own_class_carrying_the_reason() -> None:
    assert set(FAMILIES) == set(Family) - {Family.NONE}
    for reason, meaning in reasons.TABLE.items():
        error = ClientError(reason, "refused", "s")
        assert type(error) is FAMILIES.get(meaning.family, ClientError), reason
        assert error.reason == reason and error.exit_code == meaning.exit and isinstance(error, ClientError)
    assert type(ClientError("A_NEWER_PEERS_REASON", "refused")) is ClientError
    assert type(ClientError(Reason.WRONG_TENANT, "x")) is public.PermissionDenied


def test_every_refusal_a_caller_branches_on_has_a_family() -> None:
    # The coordinator's refusals that a caller acts on by kind: held, unknown, stale, permission,
    # unavailable, bad input. Adding a reason means deciding its family (or none) here too.
    none = {reason for reason, meaning in reasons.TABLE.items() if meaning.family == Family.NONE}
    assert none == {Reason.FREE, Reason.OWNER_DEAD, Reason.RESERVATION_SUPERSEDED, Reason.CHAIN_FULL,
                    Reason.HOST_LIVE, Reason.HOST_FENCED, Reason.GUARD_FAILED, Reason.CARRY_FAILED,
                    Reason.INTERRUPTED, Reason.TERMINATED, Reason.CARRY_BUDGET_EXHAUSTED,
                    Reason.CARRY_CORRUPT, Reason.RECORD_TOO_LARGE, Reason.GRANT_DIR_FAILED}


def test_committing_the_callers_own_pid_is_refused_naming_it() -> None:
    grant = Grant("s", 1, "secret", "token", "HOLDFAST_SPAWN_TOKEN", "127.0.0.1:9")

    async def commit() -> None:
        async with Client("127.0.0.1:9", "h") as client:  # nothing listens: nothing may be asked
            await client.commit(grant, os.getpid(), lambda _identity: True)

    with pytest.raises(BadInput, match=f"pid {os.getpid()} is this process itself"):
        asyncio.run(commit())


def test_options_are_runs_and_cmd_is_a_list() -> None:
    spec, forward = spec_of("s", ("sleep", "1"), {"takeover": True, "force": True, "wait": 5.0,
                                                   "guards": ("sqlite:///x",), "forward_signals": True})
    assert (spec.argv, spec.takeover, spec.force, spec.wait, spec.guards, forward) == (
        ["sleep", "1"], True, True, 5.0, ["sqlite:///x"], True)
    with pytest.raises(BadInput, match="list of words"):
        spec_of("s", "codex exec", {})
    with pytest.raises(BadInput, match="no such option: takover"):
        spec_of("s", ["x"], {"takover": True})  # type: ignore[typeddict-unknown-key]


def test_a_stale_fence_is_still_a_client_error() -> None:
    with pytest.raises(ClientError) as caught:
        raise ClientError(Reason.STALE_FENCE, "fence 1 is not the current 2", "s")
    assert isinstance(caught.value, StaleFence) and str(caught.value).startswith("STALE_FENCE: ")


def test_holdfast_run_does_not_load_the_public_api() -> None:
    """The names load on first use: `holdfast run`'s imports stay what they were (~4.5 ms)."""
    probe = ("import sys, holdfast.cli.run_commands; print(sorted(m for m in sys.modules if m in "
             "('holdfast.client.aio', 'holdfast.client.sync', 'holdfast.client.results')))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
    assert public.session is sync.session  # and then they are there


def test_every_example_of_the_page_is_python_that_imports_only_public_names() -> None:
    blocks = re.findall(r"```python\n(.*?)```", API, flags=re.S)
    assert len(blocks) > len(public.__all__)
    for block in blocks:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("holdfast"):
                assert node.module == "holdfast.client", block
                assert {alias.name for alias in node.names} <= set(public.__all__), block
