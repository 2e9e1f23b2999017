# SuperExec image for ClientApps on NVIDIA GPUs: PyPI's default PyTorch wheel brings its CUDA runtime; the host
# needs the NVIDIA container toolkit (the compose file reserves one GPU per ClientApp container). Documented, not
# run here: the machines this project is developed and tested on have no GPU and no image registry.
ARG FLOWER_IMAGE=flwr/superexec:1.42.0
FROM ${FLOWER_IMAGE}
USER root
RUN python -m pip install --no-cache-dir torch==2.14.1
COPY docker/requirements.txt /tmp/requirements.txt
RUN python -m pip install --no-cache-dir -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY pyproject.toml README.md /opt/asyncfl/
COPY asyncfl /opt/asyncfl/asyncfl
RUN python -m pip install --no-cache-dir --no-deps --no-build-isolation /opt/asyncfl
ENV ASYNCFL_CACHE_DIR=/tmp/asyncfl-cache MPLCONFIGDIR=/tmp/matplotlib
USER app
ENTRYPOINT ["flower-superexec"]
