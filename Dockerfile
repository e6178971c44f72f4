# One image for both roles: the command selects it.
#   docker build -t warmpool:0.1.0 .
#   docker run --rm warmpool:0.1.0 scheduler --help
#   docker run --rm warmpool:0.1.0 worker --processes 2 --threads 8
# deploy/image/build.sh builds it with podman on a base image made from Debian's archive
# (PYTHON_IMAGE=localhost/warmpool-base:bookworm: Debian's python3 and a venv first on PATH), and
# deploy/image/run-s1.sh runs the scheduler and two workers from it (`make image-test`).
# No `# syntax=` line: it makes BuildKit fetch its Dockerfile frontend from an image registry
# before building (an offline or mirrored builder fails there), and the built-in frontend of
# Docker 23+ and buildah already have everything used here (RUN --mount=type=bind,from=...).
# tests/unit/test_deploy_image.py checks this file's invariants (non-root numeric USER, no
# compiler or pip in the final stage, ENTRYPOINT warmpool, COPY lines vs .dockerignore);
# tests/integration/test_deploy_wheel.py replays its Python steps (wheels from exactly the COPY
# sources, install with no index, pip removed, `warmpool --help`).

# A short name, as Docker resolves it. Podman and buildah resolve short names through
# registries.conf (or refuse them): give them a fully qualified PYTHON_IMAGE, as build.sh does.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- builder: the project's wheel and the wheels of all its dependencies ---------------------
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Everything the wheel is built from, and nothing else (.dockerignore keeps the rest out).
COPY pyproject.toml README.md ./
COPY warmpool ./warmpool
COPY scheduler ./scheduler
COPY workers ./workers
COPY metrics ./metrics
RUN python -m pip wheel --wheel-dir /wheels . \
    && ls /wheels/warmpool-*.whl

# --- final: the wheels installed, no build tools, non-root ------------------------------------
FROM ${PYTHON_IMAGE} AS final
LABEL org.opencontainers.image.title="warmpool" \
      org.opencontainers.image.description="Theia Cloud pool controller: scheduler and workers" \
      org.opencontainers.image.licenses="EPL-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PROMETHEUS_MULTIPROC_DIR=/var/run/warmpool/prometheus
# Install from the builder's wheels only (no index: nothing is compiled or fetched here), then
# remove pip, setuptools and wheel: nothing installs anything at run time. The wheels are
# bind-mounted, so they take no layer.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links=/wheels /wheels/warmpool-*.whl \
    && python -m pip uninstall --yes pip setuptools wheel \
    && groupadd --system --gid 10001 warmpool \
    && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin warmpool \
    && mkdir -p /var/run/warmpool/prometheus \
    && chown -R 10001:10001 /var/run/warmpool \
    && warmpool --help >/dev/null
# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
WORKDIR /tmp
# The two paths the processes write: /tmp, and the workers' PROMETHEUS_MULTIPROC_DIR (the
# supervisor empties it at start and each worker process writes its metrics files there).
# Volumes, so that they stay writable under `docker run --read-only` (an anonymous volume each,
# gone with --rm), where a directory of the image's own is not. Kubernetes mounts emptyDirs
# over both (deploy/base: the root filesystem is read-only there).
VOLUME ["/tmp", "/var/run/warmpool/prometheus"]
EXPOSE 8080 8081 9090 9091
ENTRYPOINT ["warmpool"]
CMD ["--help"]
