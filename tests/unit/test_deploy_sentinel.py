"""deploy/components/redis-sentinel: once the workers' readiness probe parsed the Redis URL
with redis-py's own parser (no Sentinel form), and the component replaced it. The probe is now
the worker supervisor's /readyz, which pings through warmpool's connection code: the component
changes nothing (kept so that overlays naming it still build), and the ping fails, without
waiting through a failover, when no Sentinel answers. That it passes against real Sentinels is
checked in tests/integration/test_queue_sentinel.py."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from tests.unit.test_deploy_manifests import DEPLOY, _rel, container, kustomize
from workers.health import redis_ping


def _with_component() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [_rel(DEPLOY / "base", Path(tmp))],
            "components": [_rel(DEPLOY / "components" / "redis-sentinel", Path(tmp))],
        }))
        return kustomize(Path(tmp))


def test_the_component_changes_nothing_and_the_probe_is_readyz() -> None:
    base = kustomize(DEPLOY / "base")
    assert _with_component() == base
    probe = container(base, "warmpool-worker")["readinessProbe"]
    assert probe["httpGet"] == {"path": "/readyz", "port": "health"}


def test_the_ping_fails_by_itself_when_no_sentinel_answers() -> None:
    ping = redis_ping("redis+sentinel://127.0.0.1:1,127.0.0.1:2/svc/0")
    with pytest.raises(redis.exceptions.ConnectionError):  # MasterNotFoundError is one
        ping()
