"""The control plane over etcd: session records, fencing, adjudication, routing every probe to the owner's
own host, lifecycle. Stateless: any number of coordinators behave as one."""
