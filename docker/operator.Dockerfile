# syntax=docker/dockerfile:1.7
# The operator image: the distillery API, kopf, the Kubernetes client and prometheus-client. No torch,
# vLLM or Ray (the operator never imports them), so it stays around 150 MB.
#   docker build -f docker/operator.Dockerfile -t ghcr.io/distillery-ai/distillery-operator:0.1.0 .
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/distillery
WORKDIR /src
# The dependencies first, read from pyproject.toml, then our package without them: a change to our sources
# rebuilds only the layers from the COPY of the sources on.
COPY pyproject.toml ./
RUN /opt/distillery/bin/python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['operator']))" > /tmp/requirements.txt \
 && /opt/distillery/bin/pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt
COPY README.md ./
COPY distillery ./distillery
COPY operator ./operator
# The runtime's sources come along (one distribution for the API, operator, runtime and CLI), its
# dependencies do not.
COPY runtime ./runtime
COPY cli ./cli
# The build fails if anything pulled the ML stack in.
RUN /opt/distillery/bin/pip install --no-deps ".[operator]" \
 && ! /opt/distillery/bin/pip show torch vllm ray 2>/dev/null | grep -q '^Name:'

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="distillery-operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/distillery-ai/distillery" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/distillery /opt/distillery
ENV PATH=/opt/distillery/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Non-root, numeric (the chart's restricted securityContext runs it as 65532 with a read-only root).
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["distillery"]
CMD ["operator", "--all-namespaces"]
