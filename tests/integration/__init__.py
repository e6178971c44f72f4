"""Integration tests: the real Redis and a real kube-apiserver+etcd (session fixtures)."""
