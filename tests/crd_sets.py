"""Run a system test on both Theia Cloud lines: warmpool's own CRDs (the EduIDE-Cloud fork's
versions, AppDefinition v1beta11) and upstream Theia Cloud's (v1beta10, the vendored chart in
warmpool/kube/crds/theia-cloud-upstream, rendered by `warmpool.cluster.local`).

`BOTH_CRD_SETS` parametrizes the session fixture `crds` (tests/conftest.py): the tests of one
set run together, on that set's control plane, and each control plane starts once a session.
"""

from __future__ import annotations

import pytest

from warmpool.cluster.local import CRD_SETS

BOTH_CRD_SETS = pytest.mark.parametrize("crds", CRD_SETS, scope="session")
