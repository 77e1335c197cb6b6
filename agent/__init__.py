"""The per-host agent: it alone judges whether a process on its host is alive (attestation, probes, the
exit watch, kill), answers only coordinators, and never imports the coordinator or the client."""
