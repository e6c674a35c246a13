# syntax=docker/dockerfile:1.7
# The runtime image: the trainer (Ray head and workers of a job's RayJob) and the standalone teachers
# (`python -m distillery_runtime.teachers.server`): torch + vLLM + Ray + distillery[runtime].
#   docker build -f docker/runtime.Dockerfile -t ghcr.io/distillery-ai/distillery-runtime:0.1.0 .
# The default is the CUDA build for GPU clusters. Build arguments choose the CPU build that CI runs on
# a real node (docker/build-cpu-images.sh): a Debian base, CPU torch and vLLM's CPU wheel.
ARG BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
# vLLM pins the torch build it was compiled against; installing it first lets pip keep that torch.
ARG VLLM_PACKAGE=vllm
ARG VLLM_VERSION=0.32.0
# Empty: the torch vLLM pins (CUDA). The CPU build pins CPU torch first, from TORCH_INDEX_URL when set.
ARG TORCH_PACKAGE=
ARG TORCH_INDEX_URL=
# What the vLLM wheel brings but cannot import beside the chosen torch (the CPU wheel's torchvision).
ARG PIP_UNINSTALL=
LABEL org.opencontainers.image.title="distillery-runtime" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/distillery-ai/distillery" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 VIRTUAL_ENV=/opt/distillery PATH=/opt/distillery/bin:$PATH
# libnuma1: vLLM's compiled ops link it (the CPU wheel failed to import without it, found on a node);
# wget: KubeRay's exec probes call it; git: Hugging Face downloads of repos with code; tini: reaps
# the Ray and vLLM worker processes; python-is-python3: KubeRay's submitter runs `python`. Versions come
# from the base image's release (pinning exact Debian versions breaks the build whenever the archive moves on).
# KubeRay starts every Ray container with `bash -lc`, and /etc/profile resets PATH, which drops the ENV
# above: the profile.d line puts the venv back for login shells, or `ray` and `distillery` are not found.
# hadolint ignore=DL3008,SC2016
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev python-is-python3 \
        build-essential libnuma1 wget git ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/distillery \
 && echo 'export VIRTUAL_ENV=/opt/distillery PATH=/opt/distillery/bin:$PATH' > /etc/profile.d/distillery.sh
# hadolint ignore=DL3013
RUN if [ -n "${TORCH_PACKAGE}" ]; then \
      pip install ${TORCH_INDEX_URL:+--extra-index-url "${TORCH_INDEX_URL}"} "${TORCH_PACKAGE}"; fi \
 && pip install "${VLLM_PACKAGE}==${VLLM_VERSION}" \
 && if [ -n "${PIP_UNINSTALL}" ]; then pip uninstall -y ${PIP_UNINSTALL}; fi
WORKDIR /src
# Our package's dependencies (pyproject's ranges, within vLLM's pins), read from pyproject.toml, then the
# package without them: a change to our sources rebuilds only the layers from the COPY of the sources on.
COPY pyproject.toml ./
# hadolint ignore=DL3013
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['runtime']))" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && if [ -n "${PIP_UNINSTALL}" ]; then pip uninstall -y ${PIP_UNINSTALL}; fi \
 && rm /tmp/requirements.txt
COPY README.md ./
COPY distillery ./distillery
COPY operator ./operator
COPY runtime ./runtime
COPY cli ./cli
WORKDIR /
# hadolint ignore=DL3013
RUN pip install --no-deps "/src[runtime]" \
 && rm -rf /src
# Ray expects a writable home; KubeRay runs the containers as this user (uid 1000) by default.
RUN useradd --uid 1000 --create-home --shell /bin/bash ray
USER 1000:1000
WORKDIR /home/ray
EXPOSE 8000 9100
ENTRYPOINT ["/usr/bin/tini", "--"]
# The RayJob sets its own entrypoint (`distillery run /etc/distillery/runtime-config.json`); the
# teacher Deployment runs `python -m distillery_runtime.teachers.server ...`.
CMD ["distillery", "--help"]
