# The two commands a newcomer needs: `make demo` and `make test`.
# Everything they need is installed here: the virtualenv with pinned packages, and the
# control-plane binaries built once per machine from pinned Go modules
# (cached in ~/.cache/provisioner, never in the repository).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast test-localstack lint format binaries observability-binaries image node-tools up down status clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

binaries: $(STAMP)
	$(PY) -m provisioner dev build

demo: binaries
	$(PY) -m provisioner dev demo

# With PROVISIONER_TEST_KUBECONFIG (a cluster you already have), nothing is built.
TEST_BINARIES := $(if $(PROVISIONER_TEST_KUBECONFIG),$(STAMP),binaries)

# Prometheus, promtool and Jaeger for the alerts', dashboards' and traces' tests, built before
# pytest (a cold build outlasts a test's timeout); where they cannot be built, those tests
# skip, saying why.
observability-binaries: $(STAMP)
	$(PY) -m provisioner dev build --only-observability \
		|| echo "make: Prometheus or Jaeger cannot be built here: their tests will skip"

test: lint $(TEST_BINARIES) observability-binaries
	$(PY) -m pytest
	$(MAKE) --no-print-directory test-localstack

test-fast: $(STAMP)
	$(PY) -m pytest tests/unit tests/cloud

# S3Bucket and Queue end to end against LocalStack (its runtime in its own virtualenv,
# installed once into ~/.cache/provisioner), and a DatabaseInstance that must fail clearly.
test-localstack: $(TEST_BINARIES)
	PROVISIONER_TEST_CLOUD=localstack $(PY) -m pytest tests/e2e/test_bucket.py \
		tests/e2e/test_queue.py tests/e2e/test_bucket_notifications.py tests/e2e/test_localstack.py

# The operator's image from the Dockerfile, with buildah (vfs storage, chroot isolation) on a
# base made from Debian's packages by mmdebstrap (no registry needed). Needs root; installs
# buildah, mmdebstrap and runc from Debian when they are missing. See provisioner_dev/image.py.
IMAGE_TOOLS := buildah mmdebstrap runc
image: $(STAMP)
	@test "$$(id -u)" = 0 || { echo "make image: needs root (buildah, apt-get)" >&2; exit 1; }
	@missing=""; for t in $(IMAGE_TOOLS); do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
		echo "make image: installing$$missing from Debian's packages (apt-get)"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing \
			|| exit 1; \
	else echo "make image: buildah, mmdebstrap and runc are installed"; fi
	$(PY) -m provisioner dev image

# What the image and node tests need from Debian (root only; they skip, saying why, without):
# buildah, mmdebstrap and runc for the image; containerd, the CNI plugins, iptables, iproute2
# and gcc (the pause image) for a node that runs the chart's pods.
NODE_PACKAGES := buildah mmdebstrap runc containerd containernetworking-plugins iptables \
	iproute2 conntrack gcc
node-tools:
	@if [ "$$(id -u)" != 0 ]; then echo "make node-tools: not root, nothing installed"; exit 0; fi; \
	missing=""; for p in $(NODE_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then echo "make node-tools: all installed"; exit 0; fi; \
	echo "make node-tools: installing$$missing from Debian's packages (apt-get)"; \
	apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing

# Style, types (strict on the operator's package) and import contracts, all set in pyproject.toml.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-logo

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

up: binaries
	$(PY) -m provisioner dev up

status: $(STAMP)
	$(PY) -m provisioner dev status

down: $(STAMP)
	$(PY) -m provisioner dev down

clean: down
	rm -rf $(VENV)
