# The operator image: `docker build -t provisioner:0.1.0 .`, or `make image` (buildah, with a
# base made from Debian's packages passed as BASE_IMAGE; see provisioner_dev/image.py).
#
# Three stages on the same pinned base: the builder installs the package and its pinned runtime
# dependencies (constraints.txt; no dev extras, so no moto, pytest, ruff or kubernetes client)
# into a virtualenv; the rootfs stage adds that virtualenv and the operator's
# user to the base and removes what the operator never runs; the image is that root
# filesystem as one layer. It runs as uid 65532 on a read-only root filesystem (the chart
# mounts an emptyDir at /tmp, which is also HOME).

# Any Debian bookworm with python3.11 (and python3-venv, useradd) will do.
ARG BASE_IMAGE=python:3.11.17-slim-bookworm
# The AWS services the operator calls (provisioner/aws/botodata.py, SERVICES): botocore keeps
# only their models.
ARG AWS_SERVICES="ec2 eks iam rds resourcegroupstaggingapi s3 sns sqs sts"

FROM ${BASE_IMAGE} AS builder
ARG AWS_SERVICES

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
# Trimmed of what the operator never loads: botocore carries the API models of every AWS
# service (~25 MB compressed); the operator calls only rds, s3, sqs, sns, iam, eks (pod
# identity), sts and resourcegroupstaggingapi (batched tag reads), so the others are dropped
# (checked by creating those clients, and by the operator's own sessions, which read its pruned
# endpoint table and S3 model first: provisioner/aws/botodata.py); pip and setuptools are not
# needed to run.
RUN site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    && for d in "$site"/botocore/data/*/; do \
         case " $AWS_SERVICES " in *" $(basename "$d") "*) ;; *) rm -rf "$d" ;; esac; \
       done \
    && python -c 'import kopf, provisioner.cli, provisioner.runtime.handlers' \
    && python -c 'import boto3, os; [boto3.client(s, region_name="us-east-1") for s in os.environ["AWS_SERVICES"].split()]' \
    && python -c 'from provisioner.aws import botodata; botodata.check()' \
    && python -m pip uninstall --yes --quiet pip setuptools


# The runtime's root filesystem: the base, the operator's user and virtualenv, and nothing
# the operator never runs (Debian's package tools and perl, glibc's iconv modules, time zones,
# documentation, Python's own test suite, 2to3, tkinter, ensurepip and the wheels behind it).
# dpkg's database stays, so that image scanners still see what the base is made of.
FROM ${BASE_IMAGE} AS rootfs
ARG AWS_SERVICES

# A passwd entry for uid 65532: kopf names its peering identity after the user
# (getpass.getuser()), which fails for a uid without one.
RUN groupadd --system --gid 65532 provisioner \
    && useradd --system --uid 65532 --gid 65532 --home-dir /tmp --no-create-home \
       --shell /usr/sbin/nologin provisioner

COPY --from=builder /opt/venv /opt/venv

RUN rm -rf /usr/bin/perl* /usr/lib/x86_64-linux-gnu/perl* /usr/share/perl* \
       /usr/lib/x86_64-linux-gnu/gconv /usr/bin/localedef \
       /usr/bin/apt* /usr/lib/apt /usr/lib/x86_64-linux-gnu/libapt-* /etc/apt /var/lib/apt \
       /var/cache/* /var/log/* \
       /usr/share/zoneinfo /usr/share/doc /usr/share/man /usr/share/info /usr/share/locale \
       /usr/share/bash-completion /usr/share/python-wheels /usr/share/lintian \
    && for lib in /usr/lib/python3.11 /usr/local/lib/python3.11; do \
         rm -rf "$lib"/test "$lib"/lib2to3 "$lib"/pydoc_data "$lib"/ensurepip "$lib"/idlelib \
                "$lib"/tkinter "$lib"/turtledemo "$lib"/distutils "$lib"/sqlite3 \
                "$lib"/lib-dynload/_sqlite3* "$lib"/lib-dynload/_tkinter*; \
       done \
    && /opt/venv/bin/python -c 'import kopf, provisioner.cli, provisioner.runtime.handlers' \
    && /opt/venv/bin/python -c 'import boto3, os; [boto3.client(s, region_name="us-east-1") for s in os.environ["AWS_SERVICES"].split()]' \
    && /opt/venv/bin/python -c 'from provisioner.aws import botodata; botodata.check()' \
    && mkdir -p /tmp && chmod 1777 /tmp


# One layer: what the stage above left, and no layer underneath still holding the rest.
FROM scratch

COPY --from=rootfs / /

ENV PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp

USER 65532
# 8080: /healthz (liveness and readiness); 9090: --metrics-port.
EXPOSE 8080 9090
ENTRYPOINT ["provisioner", "run"]
