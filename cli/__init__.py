"""The `holdfast` command: one module per command group, over the client library's public names."""
