# cadenza's server image: what `make install` installs (torch pinned and first, then the
# project with its dependencies), without the development extras.
#
# GPU nodes (the default base):
#   docker build -t cadenza:0.1.0 .
# CPU-only nodes:
#   docker build -t cadenza:0.1.0-cpu --build-arg BASE_IMAGE=debian:bookworm-slim \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu .
#
# Which torch build lands is the wheel index's choice, not the base image's: the default index
# serves the CUDA build for Linux, which brings its own CUDA libraries as wheels, while the CPU
# index serves the build without CUDA (several GB smaller), the one `make install` takes from
# disk. The CUDA base adds what the node's NVIDIA container toolkit reads to mount the driver
# (NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES); the driver must be new enough for the
# wheel's CUDA.
ARG BASE_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
FROM ${BASE_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=

# python3 >= 3.11; compilers: cadenza builds its native CPU kernels at the first start (C++),
# Triton its kernels' launchers on a GPU (C, against Python's headers); tini as PID 1 (below).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-dev python3-venv gcc g++ tini \
    && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/cadenza
ENV PATH=/opt/cadenza/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

RUN pip install --no-cache-dir --upgrade pip \
    && pip install --no-cache-dir ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
        "torch==${TORCH_VERSION}"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY cadenza ./cadenza
RUN pip install --no-cache-dir . && rm -rf /src

# Not root. Its home holds the caches that are not volumes (native kernels, Triton's).
RUN groupadd --gid 10001 cadenza && useradd --create-home --uid 10001 --gid 10001 cadenza
USER 10001
WORKDIR /home/cadenza
EXPOSE 8000 8001

# tini passes SIGTERM to the edge alone (not to its engine processes, which the edge stops
# itself once it has drained) and reaps what exits.
ENTRYPOINT ["/usr/bin/tini", "--", "cadenza"]
CMD ["serve", "--host", "0.0.0.0"]
