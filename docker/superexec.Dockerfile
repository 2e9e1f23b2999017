# SuperExec image: runs the ServerApp and the ClientApps (PyTorch, the data and ML packages, asyncfl) against the
# Runtime API of a SuperLink or a SuperNode. FLOWER_IMAGE is the Flower image built here by `asyncfl docker build`
# (asyncfl-flower:1.42.0) or Flower's own flwr/superexec:1.42.0 where a registry is reachable.
# Layers go from what changes least to what changes most: a code change rebuilds only the last one.
ARG FLOWER_IMAGE=asyncfl-flower:1.42.0
FROM ${FLOWER_IMAGE}
USER root
# 1. PyTorch: a wheel from docker/wheels/ in the build context if there is one (CPU builds are ~10x smaller than the
#    CUDA build PyPI serves), else TORCH_SPEC from TORCH_INDEX_URL (e.g. PyTorch's CPU index) or PyPI.
ARG TORCH_SPEC=torch==2.14.1
ARG TORCH_INDEX_URL=""
COPY docker/wheels/ /tmp/wheels/
RUN set -e; \
    if ls /tmp/wheels/torch-*.whl >/dev/null 2>&1; then \
        python -m pip install --no-cache-dir --disable-pip-version-check /tmp/wheels/torch-*.whl; \
    elif [ -n "$TORCH_INDEX_URL" ]; then \
        python -m pip install --no-cache-dir --disable-pip-version-check "$TORCH_SPEC" --index-url "$TORCH_INDEX_URL"; \
    else \
        python -m pip install --no-cache-dir --disable-pip-version-check "$TORCH_SPEC"; \
    fi; \
    rm -rf /tmp/wheels
# 2. asyncfl's other dependencies (docker/requirements.txt: pyproject.toml, Flower and PyTorch left out).
COPY docker/requirements.txt /tmp/requirements.txt
RUN python -m pip install --no-cache-dir --disable-pip-version-check -r /tmp/requirements.txt && rm /tmp/requirements.txt
# 3. asyncfl itself: the library a user's app imports (a run's FAB brings the app's own code).
COPY pyproject.toml README.md /opt/asyncfl/
COPY asyncfl /opt/asyncfl/asyncfl
RUN python -m pip install --no-cache-dir --disable-pip-version-check --no-deps --no-build-isolation /opt/asyncfl
ENV ASYNCFL_CACHE_DIR=/tmp/asyncfl-cache MPLCONFIGDIR=/tmp/matplotlib
USER app
ENTRYPOINT ["flower-superexec"]
