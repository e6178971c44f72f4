"""The scheduler: watches the cluster and turns changes into work keys on the queue.

- `mapping`: the pure event -> keys function (``keys_for``) and the cache stubs.
- `reflector`: list + watch + relist-on-410 for one kind in one namespace.
- `leader`: leader election on a coordination.k8s.io/v1 Lease.
- `app`: the run loop (reflectors, elector, dispatcher, resyncs).
- `cli`: the `scheduler` click command (health endpoints, graceful SIGTERM).
"""
