# SuperExec image for the asyncfl ServerApp and ClientApps (CPU). Flower's pinned SuperExec image plus
# PyTorch, the data and ML packages, and asyncfl itself; Flower stays the image's own version.
ARG FLWR_VERSION=1.41.0
FROM flwr/superexec:${FLWR_VERSION}

# A CPU-only PyTorch wheel index keeps the image small; leave empty to use the default index.
ARG TORCH_INDEX_URL=""
WORKDIR /app
COPY --chown=app:app pyproject.toml README.md ./
COPY --chown=app:app asyncfl ./asyncfl
RUN if [ -n "$TORCH_INDEX_URL" ]; then \
        python -m pip install --no-cache-dir torch==2.14.1 --index-url "$TORCH_INDEX_URL"; \
    else \
        python -m pip install --no-cache-dir torch==2.14.1; \
    fi \
 && sed -i 's/^ *"flwr\[simulation\]==.*//' pyproject.toml \
 && python -m pip install --no-cache-dir .

ENV ASYNCFL_CACHE_DIR=/tmp/asyncfl-cache
ENTRYPOINT ["flower-superexec"]
