#!/usr/bin/env bash
# Set up (see setup.sh), bring the database up to date, and run the Telegram bot with the settings in .env.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# .env will hold the bot's token: readable by its owner only (umask 077 makes the copy 0600).
[ -f .env ] || { (umask 077 && cp .env.example .env); echo "created .env from .env.example: put your TELEGRAM_BOT_TOKEN in it" >&2; }
.venv/bin/qwenbot migrate
exec .venv/bin/qwenbot run "$@"
