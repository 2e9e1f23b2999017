# Flower for the SuperLink and the SuperNodes (no ML packages): what Flower's flwr/superlink and flwr/supernode
# images hold, built on this machine. BASE is any image with python3 (>= 3.10) and its venv module:
# python:3.11-slim where a registry is reachable, or the Debian base `asyncfl docker base` makes where none is.
# Layout as in Flower's images: a venv at /python/venv first on PATH, user `app` (uid 49999), workdir /app.
ARG BASE=asyncfl-base:bookworm
FROM ${BASE}
ARG FLWR_VERSION=1.42.0
# A CA bundle for pip where the package index is reached through a TLS-inspecting proxy (docker/trust/, filled by
# `asyncfl docker build --ca-bundle`); with none there, pip keeps the system's certificates.
COPY docker/trust/ /etc/pip-trust/
RUN set -e; \
    if [ -f /etc/pip-trust/ca-bundle.crt ]; then printf '[global]\ncert = /etc/pip-trust/ca-bundle.crt\n' > /etc/pip.conf; fi; \
    getent group app >/dev/null || groupadd --gid 49999 app; \
    id -u app >/dev/null 2>&1 || useradd --uid 49999 --gid app --home-dir /app --no-create-home --shell /usr/sbin/nologin app; \
    python3 -m venv /python/venv; \
    /python/venv/bin/python -m pip install --no-cache-dir --disable-pip-version-check "flwr==${FLWR_VERSION}"; \
    mkdir -p /app/state /app/outputs; chown -R app:app /app
# HOME and FLWR_HOME live on the tmpfs the containers mount at /tmp: the root filesystem is read-only.
ENV PATH=/python/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp FLWR_HOME=/tmp/flwr-home
WORKDIR /app
USER app
