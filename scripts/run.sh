#!/usr/bin/env bash
# Set up (see setup.sh: pip runs only when something changed), bring the database up to date, and run the
# Telegram bot with the settings in .env. SIGTERM and SIGINT reach the bot, which finishes running turns first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# .env will hold the bot's token: readable by its owner only (umask 077 makes the copy 0600).
[ -f .env ] || { (umask 077 && cp .env.example .env); echo "created .env from .env.example: put your TELEGRAM_BOT_TOKEN in it" >&2; }

suggest_doctor() {
  echo "run.sh: that failed; '.venv/bin/qwenbot doctor' checks settings, token, database and model, and says what to fix" >&2
}
.venv/bin/qwenbot migrate || { status=$?; suggest_doctor; exit "$status"; }

# In the background, so that this script can pass a stop signal on (bash does not forward them to a child).
bot=
trap '[ -z "$bot" ] || kill -TERM "$bot" 2>/dev/null || true' TERM INT
.venv/bin/qwenbot run "$@" &
bot=$!
while kill -0 "$bot" 2>/dev/null; do  # a trapped signal ends a wait early, not the bot: wait until it stops
  wait "$bot" || true
done
status=0
wait "$bot" || status=$?  # the bot's own exit status (bash keeps it)
[ "$status" -eq 0 ] || suggest_doctor
exit "$status"
