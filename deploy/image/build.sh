#!/usr/bin/env bash
# Build the warmpool image from the Dockerfile at the top of the repository, on this machine,
# with Debian's podman (rootful) and a base image made from Debian's archive: no image registry
# is needed or contacted.
#
#   deploy/image/build.sh            # base image if missing, then localhost/warmpool:<version>
#   WARMPOOL_REBUILD_BASE=1 deploy/image/build.sh   # remake the base image too
#
# 1. The base (once; skipped when the tag exists): mmdebstrap makes a bookworm minbase root
#    filesystem with python3, python3-venv and ca-certificates, and a venv in /opt/venv (pip
#    and setuptools from Debian's wheels), the merged-usr hook keeping it small; `podman
#    import` tags it localhost/warmpool-base:bookworm, /opt/venv/bin first on PATH, so that the
#    Dockerfile's `python -m pip` and `warmpool` are the venv's. The apt sources are this
#    machine's own (its /etc/apt sources for the suite), so the archive is the one apt uses here.
# 2. The image: `podman build --pull=never --network host --build-arg PYTHON_IMAGE=<base>`.
#    The builder stage's `pip wheel` reaches the package index over the host's network and
#    trusts the host's CA bundle, bind-mounted read-only over the base's for the RUN steps only
#    (it is not in any layer). Nothing else of the host's pip configuration (its pip.conf, its
#    PIP_* environment, its local wheel directories) is passed in: the build checks the image
#    for it afterwards. Ulimits: none above the host's hard limits (`--ulimit nofile=H:H`,
#    `nproc=32768:32768`), as the container runtime cannot raise them here.
#
# Prints the image's size and the time each step took. Needs root (rootful podman) and the
# Debian packages podman, runc and mmdebstrap. The OCI runtime is runc (crun refuses this
# machine's cgroups); override with WARMPOOL_OCI_RUNTIME.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

die() { echo "image: $*" >&2; exit 1; }
say() { echo "image: $*" >&2; }

SUITE=${WARMPOOL_BASE_SUITE:-bookworm}
BASE=${WARMPOOL_BASE_IMAGE:-localhost/warmpool-base:${SUITE}}
RUNTIME=${WARMPOOL_OCI_RUNTIME:-runc}
CA_BUNDLE=${WARMPOOL_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

# --- what this needs, said plainly when it is missing -----------------------------------------
[[ $(id -u) == 0 ]] || die "run as root: the build and the containers use rootful podman"
missing=()
for tool in podman "$RUNTIME" mmdebstrap python3; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
    die "missing: ${missing[*]}. Install Debian's packages: apt-get install --no-install-recommends podman runc mmdebstrap python3"
fi
VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
IMAGE=${WARMPOOL_IMAGE:-localhost/warmpool:${VERSION}}
[[ -r $CA_BUNDLE ]] || die "no CA bundle at $CA_BUNDLE (Debian's ca-certificates package)"
podman=(podman --runtime "$RUNTIME")
# podman's default ulimits (nofile 1048576) are above this machine's hard limits, which the
# runtime may not raise: every build and run gets the host's own.
NOFILE=$(ulimit -Hn)
ulimits=(--ulimit "nofile=$NOFILE:$NOFILE" --ulimit nproc=32768:32768)
# A container of the image, the check's exit code kept apart from podman's own (125-127).
check_run() {
    local what=$1 rc=0
    shift
    "${podman[@]}" run --rm --network none "${ulimits[@]}" "$@" || rc=$?
    ((rc == 0)) && return 0
    ((rc >= 125)) && die "podman could not run the check '$what' (exit $rc, see above)"
    die "$IMAGE: $what (see above)"
}

now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }
size_mb() {
    python3 -c "import sys; print(f'{int(sys.argv[1]) / 1e6:.0f} MB')" \
        "$("${podman[@]}" image inspect --format '{{.Size}}' "$1")"
}

# --- 1. the base image ------------------------------------------------------------------------
# The host's apt sources that carry $SUITE: each file is pasted into the chroot as it is
# (deb822 or one-line); mmdebstrap adds nothing of its own when sources are given.
host_sources() {
    local f
    if [[ -n ${WARMPOOL_BASE_SOURCES:-} ]]; then
        echo "$WARMPOOL_BASE_SOURCES"
        return
    fi
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [[ -f $f ]] || continue
        # Only entries that are enabled and name the suite (not a third-party repository).
        if grep -v '^\s*#' "$f" | grep -qw "$SUITE"; then
            echo "$f"
        fi
    done
}

# The host's apt options that make its archive usable at all (a mirror whose Release files
# are not refreshed needs them), taken from apt's own configuration, not written here.
host_apt_options() {
    apt-config dump 2>/dev/null | grep -E '^Acquire::(Check-Valid-Until|Check-Date) ' || true
}

make_base() {
    local t0 work sources opts=() line
    t0=$(now)
    mapfile -t sources < <(host_sources)
    ((${#sources[@]})) || die "no apt source on this machine names '$SUITE' (set WARMPOOL_BASE_SOURCES to a sources file)"
    while IFS= read -r line; do
        [[ -n $line ]] && opts+=("--aptopt=$line")
    done < <(host_apt_options)
    work=$(mktemp -d /var/tmp/warmpool-base.XXXXXX)
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" EXIT
    say "making $BASE with mmdebstrap (sources: ${sources[*]})"
    mmdebstrap --variant=minbase --mode=root --format=tar \
        --include=python3,python3-venv,ca-certificates \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        "${opts[@]}" \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook='chroot "$1" python3 -m venv /opt/venv' \
        --customize-hook='chroot "$1" /opt/venv/bin/python -m pip --version' \
        --customize-hook='rm -f "$1"/etc/apt/apt.conf.d/99mmdebstrap "$1"/etc/dpkg/dpkg.cfg.d/99mmdebstrap' \
        --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
        "$SUITE" "$work/rootfs.tar" "${sources[@]}" >&2
    "${podman[@]}" import \
        --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["python"]' \
        --message "Debian $SUITE minbase, python3 and a venv in /opt/venv (deploy/image/build.sh)" \
        "$work/rootfs.tar" "$BASE" >/dev/null
    rm -rf "$work"
    trap - EXIT
    say "base $BASE: $(size_mb "$BASE"), made in $(elapsed "$t0") s"
}

T0=$(now)
if [[ -n ${WARMPOOL_REBUILD_BASE:-} ]] || ! "${podman[@]}" image exists "$BASE"; then
    make_base
else
    say "base $BASE exists ($(size_mb "$BASE")); WARMPOOL_REBUILD_BASE=1 remakes it"
fi

# --- 2. the image -----------------------------------------------------------------------------
T1=$(now)
say "building $IMAGE from Dockerfile on $BASE"
# --layers: the builder's `pip wheel` layer is reused while its COPY sources are unchanged.
"${podman[@]}" build --pull=never --network host --layers \
    --build-arg "PYTHON_IMAGE=$BASE" \
    "${ulimits[@]}" \
    --volume "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro" \
    --tag "$IMAGE" --file Dockerfile . >&2
BUILD_S=$(elapsed "$T1")
# The image this tag pointed at before, if the build moved it: untagged now, nothing uses it.
# (Only warmpool's own: the filter is the Dockerfile's title label; the builder stage's
# layers stay, as the cache of the next build.)
"${podman[@]}" image prune --force \
    --filter label=org.opencontainers.image.title=warmpool >/dev/null

# --- 3. what the image must not carry from this host, and that it starts ----------------------
# As root, so that /root is readable too.
check_run "it carries nothing of the host's pip configuration" \
    --read-only --user 0:0 --entrypoint python3 "$IMAGE" -c '
import os, pathlib, sys
own = {"PIP_DISABLE_PIP_VERSION_CHECK", "PIP_NO_CACHE_DIR"}  # the Dockerfile ENV, not the host
leaks = sorted(k for k in os.environ if k.startswith("PIP_") and k not in own)
leaks += [p for p in ("/etc/pip.conf", "/etc/xdg/pip", "/root/.pip", "/root/.config/pip",
                      "/opt/venv/pip.conf")
          if pathlib.Path(p).exists()]
try:
    import pip  # noqa: F401
    leaks.append("pip is installed")
except ImportError:
    pass
sys.exit(f"host configuration in the image: {leaks}" if leaks else 0)
'
# The CA bundle the RUN steps saw was the host's, mounted: the image keeps the base's own.
bundle_sum() {
    "${podman[@]}" run --rm --network none "${ulimits[@]}" --read-only --entrypoint sha256sum \
        "$1" /etc/ssl/certs/ca-certificates.crt | cut -d' ' -f1
}
image_sum=$(bundle_sum "$IMAGE")
base_sum=$(bundle_sum "$BASE")
[[ -n $image_sum && $image_sum == "$base_sum" ]] \
    || die "$IMAGE: /etc/ssl/certs/ca-certificates.crt is not the base image's (the host's leaked in)"
check_run "\`warmpool --help\` runs" --read-only --user 10001:10001 "$IMAGE" --help >/dev/null
# A read-only root with nothing mounted by hand and no tmpfs of podman's own (as
# `docker run --read-only`): the image's volumes are what the processes write.
check_run "/tmp and PROMETHEUS_MULTIPROC_DIR are writable under --read-only" \
    --read-only --read-only-tmpfs=false --user 10001:10001 --entrypoint python3 "$IMAGE" -c '
import os, tempfile
for d in (tempfile.gettempdir(), os.environ["PROMETHEUS_MULTIPROC_DIR"]):
    with open(os.path.join(d, "probe"), "w") as f:
        f.write("ok")
'

echo "image: $IMAGE $(size_mb "$IMAGE") (base $BASE $(size_mb "$BASE")); image build ${BUILD_S} s, total $(elapsed "$T0") s"
