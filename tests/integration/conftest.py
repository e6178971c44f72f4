from __future__ import annotations

import pytest
from kubernetes.client import ApiClient

from warmpool.kube.api import Kube


@pytest.fixture(scope="session")
def kube(kube_api: ApiClient) -> Kube:
    """The controller's API wrapper on the test cluster (plain dicts, typed errors)."""
    return Kube(kube_api)
