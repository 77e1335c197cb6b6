"""The one version string every part reports (agents in GetHostInfo, `holdfast version`), and the
version of the JSON documents the CLI prints (docs/json.md)."""

VERSION = "0.1.0"
# The name pip installs this under (PyPI's `holdfast` is an unrelated project); imports and the
# command stay `holdfast`.
DISTRIBUTION = "holdfast-sessions"
# Changes only when a field a reader may rely on changes meaning or type.
JSON_SCHEMA = "holdfast/v1"


def install_hint(extra: str) -> str:
    """The pip command that adds `extra` (pyproject.toml's optional dependencies) to an install."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"
