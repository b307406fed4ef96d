# The operator image: `docker build -t provisioner:0.1.0 .`, or `make image` (buildah, with a
# base made from Debian's packages passed as BASE_IMAGE; see provisioner_dev/image.py).
#
# Two stages on the same pinned base: the builder installs the package and its pinned runtime
# dependencies (constraints.txt; no dev extras, so no moto, pytest or ruff) into a virtualenv,
# and the runtime stage copies only that virtualenv. The result runs as uid 65532 on a
# read-only root filesystem (the chart mounts an emptyDir at /tmp, which is also HOME).

# Any Debian bookworm with python3.11 (and python3-venv, useradd) will do.
ARG BASE_IMAGE=python:3.11.17-slim-bookworm

FROM ${BASE_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
# Only what the package needs (see .dockerignore): the build reads pyproject.toml and README.md.
COPY pyproject.toml constraints.txt README.md ./
COPY provisioner ./provisioner
# pip compiles the .pyc files here, so the read-only runtime never has to write them.
RUN pip install --no-cache-dir -c constraints.txt . \
    && pip check
# Trimmed of what the operator never loads:
# - botocore carries the API models of every AWS service (~100 MB); the operator calls only
#   rds, s3, sqs, sns and sts, so the others are dropped (checked by creating those clients);
# - the kubernetes client ships an asyncio copy of itself, kubernetes.aio (~70 MB), that
#   neither the operator nor kopf imports, and its own *_test.py files;
# - pip and setuptools are not needed to run.
RUN site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    && for d in "$site"/botocore/data/*/; do \
         case "$(basename "$d")" in rds|s3|sqs|sns|sts) ;; *) rm -rf "$d" ;; esac; \
       done \
    && rm -rf "$site"/kubernetes/aio \
    && find "$site"/kubernetes -name '*_test.py' -delete \
    && find "$site"/kubernetes -name '*_test.*.pyc' -delete \
    && python -c 'import kubernetes, kopf, provisioner.cli' \
    && python -c 'import boto3; [boto3.client(s, region_name="us-east-1") for s in ("rds", "s3", "sqs", "sns", "sts")]' \
    && python -m pip uninstall --yes --quiet pip setuptools


FROM ${BASE_IMAGE}

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
