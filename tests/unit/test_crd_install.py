"""The local control plane's CRD install rides out a server still settling: a 500 from etcd's
broken stream right after /readyz (seen once in a full run) is retried until the install's
deadline, and any other refusal, or a 500 past the deadline, is raised."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from warmpool.cluster import local


class ApiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class Ext:
    """The apiextensions calls the install makes; `failures` are raised by creates, in turn."""

    def __init__(self, *failures: int) -> None:
        self.failures = list(failures)
        self.created: list[str] = []

    def create_custom_resource_definition(self, body: dict[str, Any]) -> None:
        if self.failures:
            raise ApiError(self.failures.pop(0))
        self.created.append(body["metadata"]["name"])

    def read_custom_resource_definition(self, name: str) -> Any:
        established = SimpleNamespace(type="Established", status="True")
        return SimpleNamespace(status=SimpleNamespace(conditions=[established]),
                               metadata=SimpleNamespace(resource_version="1"))


def test_a_500_while_the_server_settles_is_retried() -> None:
    ext = Ext(500, 503)
    names = local._install_crds(ext, ApiError, timeout=60)
    assert ext.created == names and names


@pytest.mark.parametrize("status, timeout", [(403, 60.0), (500, 0.0)],
                         ids=["refused", "500-past-the-deadline"])
def test_a_refusal_or_a_500_past_the_deadline_is_raised(status: int, timeout: float) -> None:
    with pytest.raises(ApiError):
        local._install_crds(Ext(status), ApiError, timeout=timeout)
