# syntax=docker/dockerfile:1.7
# The runtime image: the trainer (Ray head and workers of a job's RayJob) and the standalone teachers
# (`python -m distillery_runtime.teachers.server`). CUDA base + torch + vLLM + Ray + distillery[runtime].
#   docker build -f docker/runtime.Dockerfile -t ghcr.io/distillery-ai/distillery-runtime:0.1.0 .
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

FROM ${CUDA_IMAGE}
ARG VERSION=0.1.0
# vLLM pins the CUDA torch build it was compiled against; installing it first lets pip keep that torch.
ARG VLLM_VERSION=0.32.0
LABEL org.opencontainers.image.title="distillery-runtime" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/distillery-ai/distillery" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 PATH=/opt/distillery/bin:$PATH
# wget: KubeRay's exec probes call it; git: Hugging Face downloads of repos with code; tini: reaps
# the Ray and vLLM worker processes. Versions come from the base image's Ubuntu release (pinning exact
# Debian versions breaks the build whenever the archive moves on).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential \
        wget git ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/distillery
RUN pip install "vllm==${VLLM_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY distillery ./distillery
COPY operator ./operator
COPY runtime ./runtime
# Our own package from the build context; its dependencies are pinned by pyproject's ranges and vLLM's.
# hadolint ignore=DL3013
RUN pip install ".[runtime]" && rm -rf /src
# Ray expects a writable home; KubeRay runs the containers as this user (uid 1000) by default.
RUN useradd --uid 1000 --create-home --shell /bin/bash ray
USER 1000:1000
WORKDIR /home/ray
EXPOSE 8000 9100
ENTRYPOINT ["/usr/bin/tini", "--"]
# The RayJob sets its own entrypoint (`distillery run /etc/distillery/runtime-config.json`); the
# teacher Deployment runs `python -m distillery_runtime.teachers.server ...`.
CMD ["distillery", "--help"]
