"""The one version string every part reports (agents in GetHostInfo, `holdfast version`), and the
version of the JSON documents the CLI prints (docs/json.md)."""

VERSION = "0.1.0"
# Changes only when a field a reader may rely on changes meaning or type.
JSON_SCHEMA = "holdfast/v1"
