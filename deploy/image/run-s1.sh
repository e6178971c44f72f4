#!/usr/bin/env bash
# Run the real system from the image: the scheduler and two worker containers of
# localhost/warmpool:<version> (deploy/image/build.sh) against the local control plane and a
# Redis, pool-spec scenario S1 end to end, then the invariant checker
# (tests/integration/test_image_s1.py, marked `image`).
#
#   deploy/image/run-s1.sh
#
# The control plane: `warmpool cluster up` in a state directory of this run's own
# (WARMPOOL_IMAGE_TEST_STATE to reuse one), stopped again at the end if this script started it;
# the test uses its kubeconfig (WARMPOOL_TEST_KUBECONFIG). Redis: WARMPOOL_REDIS_URL, else the
# machine's 127.0.0.1:6379 (`bash .ci/run` starts one), else an embedded valkey; the test's
# keys live under a private prefix and are deleted after it. Containers this run started are
# removed after it, and so are any an interrupted earlier run left (they carry a label).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

PY=${PYTHON:-.venv/bin/python}
RUNTIME=${WARMPOOL_OCI_RUNTIME:-runc}
LABEL=warmpool.image-test
die() { echo "image-test: $*" >&2; exit 1; }
[[ -x $PY ]] || command -v "$PY" >/dev/null || die "no Python at $PY (make venv, or set PYTHON)"
command -v podman >/dev/null || die "podman is missing: apt-get install --no-install-recommends podman runc mmdebstrap"

remove_labelled() {
    local ids
    ids=$(podman --runtime "$RUNTIME" ps --all --quiet --filter "label=$LABEL") || return 0
    [[ -z $ids ]] || podman --runtime "$RUNTIME" rm --force --time 5 $ids >/dev/null || true
}
remove_labelled

STATE=${WARMPOOL_IMAGE_TEST_STATE:-}
OWN_STATE=
if [[ -z $STATE ]]; then
    STATE=$(mktemp -d /var/tmp/warmpool-image-test.XXXXXX)
    OWN_STATE=1
fi
warmpool() { "$PY" -m warmpool.cli "$@"; }
STARTED=
if ! warmpool cluster status --state-dir "$STATE/cluster" >/dev/null 2>&1; then
    STARTED=1
fi
cleanup() {
    remove_labelled
    if [[ -n $STARTED ]]; then
        warmpool cluster down --state-dir "$STATE/cluster" >/dev/null 2>&1 || true
    fi
    if [[ -n $OWN_STATE ]]; then rm -rf "$STATE"; fi
}
trap cleanup EXIT

T0=$(date +%s)
warmpool cluster up --state-dir "$STATE/cluster" >&2
eval "$(warmpool cluster env --state-dir "$STATE/cluster")"
export WARMPOOL_TEST_KUBECONFIG=$KUBECONFIG
"$PY" -m pytest -p no:cacheprovider -m image tests/integration/test_image_s1.py "$@"
echo "image-test: S1 from the image in $(( $(date +%s) - T0 )) s (control plane start included)" >&2
