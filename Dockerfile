# The operator image: `docker build -t provisioner:0.1.0 .`
#
# Two stages on the same pinned base: the builder installs the package and its pinned runtime
# dependencies (constraints.txt; no dev extras, so no moto, pytest or ruff) into a virtualenv,
# and the runtime stage copies only that virtualenv. The result runs as uid 65532 on a
# read-only root filesystem (the chart mounts an emptyDir at /tmp, which is also HOME).

FROM python:3.11.17-slim-bookworm AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
# Only what the package needs (see .dockerignore): the build reads pyproject.toml and README.md.
COPY pyproject.toml constraints.txt README.md ./
COPY provisioner ./provisioner
# pip compiles the .pyc files here, so the read-only runtime never has to write them.
RUN pip install --no-cache-dir -c constraints.txt . \
    && pip check


FROM python:3.11.17-slim-bookworm

# A passwd entry for uid 65532: kopf names its peering identity after the user
# (getpass.getuser()), which fails for a uid without one.
RUN groupadd --system --gid 65532 provisioner \
    && useradd --system --uid 65532 --gid 65532 --home-dir /tmp --no-create-home \
       --shell /usr/sbin/nologin provisioner

COPY --from=builder /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp

USER 65532
# 8080: /healthz (liveness and readiness); 9090: --metrics-port.
EXPOSE 8080 9090
ENTRYPOINT ["provisioner", "run"]
