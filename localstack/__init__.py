"""Everything on one machine: `holdfast up` (an etcd of its own, a coordinator, agents), simulated hosts
(PID namespaces on 127.0.0.N) and the bundled etcd. For development, demos and tests."""
