# The bot on the CPU. The install step is scripts/setup.sh, the same script the README's commands and CI run.
#   docker build -t qwenbot .
#   docker run -d --env-file .env -v qwenbot-data:/app/data --restart unless-stopped qwenbot
# compose.yaml wires this up with a data volume, a GPU variant and optional model servers.
FROM python:3.11-slim

# Build arguments for setup.sh. PyTorch's CPU wheel index keeps the CUDA libraries (several GB) out of this image;
# the GPU variant in compose.yaml builds with TORCH_SPEC=torch and no index (PyPI's Linux torch is the CUDA build).
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1

RUN useradd --create-home --uid 1000 qwenbot
WORKDIR /app
COPY . .
# setup.sh creates .venv, installs the package (editable, so /app is "the checkout" and DATA_DIR defaults to
# /app/data) and fetches the offline assets: Qwen's tiktoken vocabulary into /app/data, the 98 MB test model, and
# whisper-base for voice questions (/app/.cache/models/whisper-base: set ASR_MODEL to it to need no hub download).
RUN --mount=type=cache,target=/root/.cache/pip bash scripts/setup.sh && chown -R qwenbot:qwenbot /app/data

USER qwenbot
# Database, model cache (hub downloads) and vocabulary. A named volume mounted here starts with the image's copy.
VOLUME /app/data
# qwenbot runs as PID 1 and handles SIGTERM itself: running turns get SHUTDOWN_GRACE_SECONDS to finish.
CMD ["sh", "-c", ".venv/bin/qwenbot migrate && exec .venv/bin/qwenbot run"]
