# syntax=docker/dockerfile:1
# TierGate gateway image: dependencies installed from uv.lock, a non-root user, nothing written
# at run time outside /tmp (run it with a read-only root filesystem).
#   docker build -t tiergate:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: resolve nothing, install exactly what uv.lock pins ------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/tiergate \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# uv itself in hash-checking mode: the sha256 of its x86_64 and aarch64 manylinux wheels as PyPI
# serves them (`pip download uv==0.13.8 --no-deps`, then `pip hash`). A wheel that differs
# fails the build. The base image above is pinned by tag only (see docs/deployment.md).
RUN printf '%s\n' \
      'uv==0.13.8 --hash=sha256:e18a57b8b352eb7c8feb317b9f6f533c8f0ad9673fd6cf34bbe3cf1a9f6a8984 --hash=sha256:0b3e8b1a4f5e405e31e2ff33de8af4744831e9f7338539671efbd8c3c94e791d' \
      > /tmp/uv-requirements.txt \
 && python -m pip install --no-cache-dir --no-deps --require-hashes -r /tmp/uv-requirements.txt \
 && rm /tmp/uv-requirements.txt
WORKDIR /src
# Third-party dependencies first: this layer is reused until the lock file changes.
COPY pyproject.toml uv.lock ./
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-install-project
# Then the project itself, installed as a wheel (not editable) so /src is not needed later.
COPY . .
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-editable

# --- runtime: the virtual environment and nothing else --------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="tiergate" \
      org.opencontainers.image.description="OpenAI-compatible gateway for tiered self-hosted LLM serving" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 tiergate \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin tiergate
COPY --from=build /opt/tiergate /opt/tiergate
ENV PATH=/opt/tiergate/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
WORKDIR /tmp
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/livez' % os.environ.get('TIERGATE_SERVER__PORT', '8080'), timeout=3)"]
# Inside the container the gateway must listen on every interface; what the host exposes is
# decided by the publish address (compose binds 127.0.0.1) or the Kubernetes Service.
CMD ["tiergate", "serve", "--host", "0.0.0.0"]
