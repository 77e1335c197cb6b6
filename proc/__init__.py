"""This host's process table: environ, stat, the stable scan and session cgroups — read by the agent, and
by the client library ending its own tree, so both agree on what "carries the token" means."""
