#!/usr/bin/env bash
# Build a real Kubernetes v1.20.2 control plane (kube-apiserver, kube-controller-manager) from
# Debian bookworm's `kubernetes` source package, plus Debian's etcd, into a cache directory.
#
# Why from source: no package registry we can reach ships a kube-apiserver binary, but Debian's
# source package is the full upstream tree with vendor/, so it builds offline. Nothing is
# installed system-wide: apt runs against a private state directory and every .deb is unpacked
# with dpkg-deb into a private root. See shared/docs/local-kubernetes.md for the facts behind it.
#
# Usage: build.sh [CACHE_DIR]
#   CACHE_DIR defaults to ${WARMPOOL_CACHE:-$HOME/.cache/warmpool}/k8s-1.20.2
#   WARMPOOL_KEEP_SCRATCH=1 keeps the scratch tree after a failure (for debugging).
set -euo pipefail

# Bump RECIPE whenever the build changes what the binaries do (a patch added, a flag changed):
# binaries stamped with another recipe are rebuilt. local.py reads this line too.
RECIPE=2
K8S_SRC_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
K8S_ORIG_TARBALL="kubernetes_1.20.5+really1.20.2.orig.tar.gz"
DEBS=(golang-1.19-go golang-1.19-src rsync libpopt0 golang-github-modern-go-reflect2-dev
      etcd-server etcd-client)
MIN_FREE_KB=$((5 * 1024 * 1024))
SYSTEM_SOURCES=/etc/apt/sources.list.d/debian.sources

CACHE_DIR="${1:-${WARMPOOL_CACHE:-$HOME/.cache/warmpool}/k8s-1.20.2}"
BIN_DIR="$CACHE_DIR/bin"
SCRATCH="$CACHE_DIR/scratch"
WANTED=(kube-apiserver kube-controller-manager etcd etcdctl)

log() { printf '%s\n' "$*" >&2; }
die() { printf 'build.sh: error: %s\n' "$*" >&2; exit 1; }

all_present() {
    local b
    for b in "${WANTED[@]}"; do
        [[ -x "$BIN_DIR/$b" ]] || return 1
    done
    [[ "$(cat "$BIN_DIR/RECIPE" 2>/dev/null)" == "$RECIPE" ]]
}

if all_present; then
    log "build.sh: reused binaries in $BIN_DIR"
    exit 0
fi

# ---- preflight: fail early with a precise reason, before minutes of work -------------------
command -v apt-get >/dev/null || die "apt-get not found: this build needs a Debian (bookworm) machine"
command -v dpkg-deb >/dev/null || die "dpkg-deb not found: this build needs a Debian (bookworm) machine"
[[ -r "$SYSTEM_SOURCES" ]] || die "$SYSTEM_SOURCES not found: cannot derive Debian apt sources"
[[ "$(id -u)" -eq 0 ]] || die "must run as root (apt needs it for its private state); run with sudo"
for tool in make tar flock; do
    command -v "$tool" >/dev/null || die "'$tool' not found on PATH"
done

mkdir -p "$CACHE_DIR"
# One build at a time per cache dir: a second caller waits, then finds the binaries and reuses.
exec 9>"$CACHE_DIR/.build.lock"
if ! flock -n 9; then
    log "build.sh: another build is running in $CACHE_DIR, waiting for it ..."
    flock 9
fi
if all_present; then
    log "build.sh: reused binaries in $BIN_DIR (built by a concurrent run)"
    exit 0
fi

free_kb=$(df -Pk "$CACHE_DIR" | awk 'NR==2 {print $4}')
if (( free_kb < MIN_FREE_KB )); then
    die "only $((free_kb / 1024)) MB free under $CACHE_DIR; the build needs at least 5 GB of scratch space"
fi

START=$(date +%s)
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
cleanup() {
    local rc=$?
    if (( rc != 0 )) && [[ "${WARMPOOL_KEEP_SCRATCH:-}" == 1 ]]; then
        log "build.sh: FAILED (exit $rc); scratch kept in $SCRATCH"
    else
        rm -rf "$SCRATCH"
        (( rc == 0 )) || log "build.sh: FAILED (exit $rc); set WARMPOOL_KEEP_SCRATCH=1 to keep $SCRATCH"
    fi
}
trap cleanup EXIT

APT_DIR="$SCRATCH/apt"
ROOT="$SCRATCH/root"
DL="$SCRATCH/downloads"
mkdir -p "$APT_DIR/sources" "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial" "$ROOT" "$DL"

# ---- 1. sources --------------------------------------------------------------------------------
log "[1/6] downloading sources (kubernetes $K8S_SRC_VERSION) and toolchain packages ..."
# Derive both entry kinds from the machine's own sources: deb-src for `apt-get source`, deb for
# `apt-get download` (the private state has no other binary package lists).
sed -E 's/^Types:.*$/Types: deb-src/' "$SYSTEM_SOURCES" >"$APT_DIR/sources/src.sources"
sed -E 's/^Types:.*$/Types: deb/' "$SYSTEM_SOURCES" >"$APT_DIR/sources/bin.sources"
APT=(apt-get -q
     -o "Dir::Etc::SourceList=/dev/null"
     -o "Dir::Etc::SourceParts=$APT_DIR/sources"
     -o "Dir::State::Lists=$APT_DIR/lists"
     -o "Dir::Cache=$APT_DIR/cache"
     -o "APT::Sandbox::User=root")
"${APT[@]}" update >"$SCRATCH/apt-update.log" 2>&1 \
    || { tail -n 20 "$SCRATCH/apt-update.log" >&2; die "apt-get update (private state) failed"; }
(cd "$DL" && "${APT[@]}" source --download-only "kubernetes=$K8S_SRC_VERSION") >"$SCRATCH/apt-source.log" 2>&1 \
    || { tail -n 20 "$SCRATCH/apt-source.log" >&2; die "apt-get source kubernetes=$K8S_SRC_VERSION failed"; }
(cd "$DL" && "${APT[@]}" download "${DEBS[@]}") >"$SCRATCH/apt-download.log" 2>&1 \
    || { tail -n 20 "$SCRATCH/apt-download.log" >&2; die "apt-get download ${DEBS[*]} failed"; }
[[ -f "$DL/$K8S_ORIG_TARBALL" ]] || die "expected $K8S_ORIG_TARBALL after apt-get source, not found"

# ---- 2. toolchain into a private root ----------------------------------------------------------
log "[2/6] unpacking go 1.19, rsync and etcd into a private root ..."
for deb in "$DL"/*.deb; do
    dpkg-deb -x "$deb" "$ROOT"
done
GOROOT_DIR="$ROOT/usr/lib/go-1.19"
[[ -x "$GOROOT_DIR/bin/go" ]] || die "go not found at $GOROOT_DIR/bin/go after unpacking"
[[ -x "$ROOT/usr/bin/rsync" ]] || die "rsync not found in the private root after unpacking"
[[ -x "$ROOT/usr/bin/etcd" ]] || die "etcd not found in the private root after unpacking"
export PATH="$GOROOT_DIR/bin:$ROOT/usr/bin:$ROOT/bin:$PATH"
# rsync from the private root links libpopt0, which is in the private root too.
export LD_LIBRARY_PATH="$ROOT/usr/lib/x86_64-linux-gnu:$ROOT/lib/x86_64-linux-gnu:$ROOT/usr/lib:${LD_LIBRARY_PATH:-}"
rsync --version >/dev/null || die "private rsync does not run (libpopt0 missing?)"
go version >&2

# ---- 3. kubernetes tree ------------------------------------------------------------------------
log "[3/6] unpacking $K8S_ORIG_TARBALL ..."
SRC="$SCRATCH/src"
mkdir -p "$SRC"
tar -xzf "$DL/$K8S_ORIG_TARBALL" -C "$SRC" --strip-components=1
[[ -f "$SRC/cmd/kube-apiserver/apiserver.go" ]] || die "unexpected layout of $K8S_ORIG_TARBALL"
rm -f "$DL/$K8S_ORIG_TARBALL"

# ---- 4. the two mandatory patches (Kubernetes 1.20 was released for Go 1.15) --------------------
log "[4/6] patching for Go 1.19: reflect2 1.0.2, zero values in CRD validation ..."
# (a) reflect2 1.0.1 (vendored) crashes under Go >= 1.18 on the first custom-resource write;
#     Debian's 1.0.2 is API-compatible and fixes it.
R2_NEW="$ROOT/usr/share/gocode/src/github.com/modern-go/reflect2"
R2_OLD="$SRC/vendor/github.com/modern-go/reflect2"
[[ -f "$R2_NEW/reflect2.go" ]] || die "Debian reflect2 not found at $R2_NEW"
[[ -d "$R2_OLD" ]] || die "vendored reflect2 not found at $R2_OLD"
rm -rf "$R2_OLD"
cp -rL "$R2_NEW" "$R2_OLD"
# (b) Since Go 1.16 reflect.Zero returns a shared zero value, so the vendored OpenAPI type
#     validator's `reflect.DeepEqual(reflect.Zero(...), reflect.ValueOf(data))` is true for "",
#     0 and false: a custom resource with `user: ""` or `uid: 0` in a typed field is rejected as
#     "must be of type string: null". Upstream fix (kube-openapi PR 230, Kubernetes 1.21): test
#     for nil only.
ZERO_CHECK='data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data))'
mapfile -t ZERO_FILES < <(grep -rlF "$ZERO_CHECK" "$SRC/vendor" || true)
(( ${#ZERO_FILES[@]} > 0 )) || die "zero-value check of the OpenAPI validator not found in vendor/"
for f in "${ZERO_FILES[@]}"; do
    sed -i "s/data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data))/data == nil/" "$f"
    log "    patched ${f#"$SRC"/}"
done
! grep -rqF "$ZERO_CHECK" "$SRC/vendor" || die "zero-value patch did not apply"

# ---- 5. compile --------------------------------------------------------------------------------
log "[5/6] compiling kube-apiserver and kube-controller-manager (several minutes) ..."
mkdir -p "$SRC/.go/src/k8s.io" "$SCRATCH/home" "$SCRATCH/tmp"
ln -sfn ../../.. "$SRC/.go/src/k8s.io/kubernetes"
(
    cd "$SRC/.go/src/k8s.io/kubernetes"
    export GOROOT="$GOROOT_DIR" GOPATH="$SRC/.go" CGO_ENABLED=0 HOME="$SCRATCH/home"
    export GOCACHE="$SCRATCH/home/go-build" TMPDIR="$SCRATCH/tmp"
    # Go itself compiles packages in parallel (-p = cores); make parallelism adds nothing here.
    make WHAT="cmd/kube-apiserver cmd/kube-controller-manager"
) >"$SCRATCH/make.log" 2>&1 || { tail -n 40 "$SCRATCH/make.log" >&2; die "make failed"; }

# ---- 6. install into the cache -----------------------------------------------------------------
log "[6/6] installing binaries into $BIN_DIR ..."
OUT="$SRC/_output/local/bin/linux/amd64"
[[ -d "$OUT" ]] || OUT="$SRC/_output/bin"
STAGE="$CACHE_DIR/bin.new"
rm -rf "$STAGE"
mkdir -p "$STAGE" "$BIN_DIR"
cp -L "$OUT/kube-apiserver" "$OUT/kube-controller-manager" "$STAGE/"
cp -L "$ROOT/usr/bin/etcd" "$ROOT/usr/bin/etcdctl" "$STAGE/"
chmod 0755 "$STAGE"/*
# Move each binary in with rename(2): a half-copied binary is never seen as "present".
for b in "${WANTED[@]}"; do
    mv -f "$STAGE/$b" "$BIN_DIR/$b"
done
rmdir "$STAGE"
echo "$RECIPE" >"$BIN_DIR/RECIPE"
"$BIN_DIR/kube-apiserver" --version >&2
# sed, not head: head exits after a line and etcd, writing its next, dies of SIGPIPE (141),
# which pipefail makes the build's exit status (seen once, on a loaded machine).
"$BIN_DIR/etcd" --version 2>&1 | sed -n 1p >&2

log "build.sh: done in $(( $(date +%s) - START )) s; binaries in $BIN_DIR"
