"""Test and benchmark tooling that ships with the package (nothing here runs in production).

- `warmpool.testing.apiproxy.ApiProxy`: a fault-injecting proxy in front of a kube-apiserver
  (latency, 409/500/429 answers, dropped connections and watch streams, outages).
"""
