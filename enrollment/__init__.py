"""The enrollment issuer: its own gRPC service (holdfast.v1.Enrollment), listener and Kubernetes
client, which signs agent certificates for the nodes a pod's token proves. The coordinator starts
it beside its own server; it imports nothing of the coordinator's."""
