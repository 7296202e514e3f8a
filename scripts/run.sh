#!/usr/bin/env bash
# Set up (see setup.sh), bring the database up to date, and run the Telegram bot with the settings in .env.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -f .env ] || { cp .env.example .env; echo "created .env from .env.example: put your TELEGRAM_BOT_TOKEN in it" >&2; }
.venv/bin/qwenbot migrate
exec .venv/bin/qwenbot run "$@"
