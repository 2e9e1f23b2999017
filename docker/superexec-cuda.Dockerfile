# SuperExec image for ClientApps on NVIDIA GPUs: the default PyTorch wheel brings its CUDA runtime;
# the host needs the NVIDIA container toolkit (compose reserves one GPU per ClientApp container).
ARG FLWR_VERSION=1.41.0
FROM flwr/superexec:${FLWR_VERSION}

WORKDIR /app
COPY --chown=app:app pyproject.toml README.md ./
COPY --chown=app:app asyncfl ./asyncfl
RUN python -m pip install --no-cache-dir torch==2.14.1 \
 && sed -i 's/^ *"flwr\[simulation\]==.*//' pyproject.toml \
 && python -m pip install --no-cache-dir .

ENV ASYNCFL_CACHE_DIR=/tmp/asyncfl-cache
ENTRYPOINT ["flower-superexec"]
