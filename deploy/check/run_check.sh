#!/usr/bin/env bash
# Run the built image against the fake Bot API on this host and check it end to end (deploy/container.sh check).
#
# What it checks, each with a line "ok: …" (the first failure stops it with "FAILED: …"):
#   the container starts as a non-root user, with its data in a named volume, and its HEALTHCHECK turns healthy;
#   a question sent through the fake Bot API gets the scripted model's answer, after a real tool call;
#   /metrics answers with the bot's families; a backup taken while it runs is whole; a restore is refused meanwhile;
#   the healthcheck turns unhealthy when the database is made read-only, and healthy again;
#   SIGTERM stops it cleanly (exit 0) and its log is JSON lines; a new container on the same volume still has the
#   history and answers again; the image holds no test tools (pytest).
# What it does not check: the network the container gets by default (it shares the host's, to reach the fake Bot
# API on 127.0.0.1), a real Telegram or a real model, GPUs, compose itself (no compose tool here), and healthchecks
# on a timer (podman runs them from systemd timers, absent here: the script runs `podman healthcheck run`).
set -euo pipefail
cd "$(dirname "$0")/../.."
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/containers.conf}
IMAGE=${IMAGE:-localhost/qwenbot:check}
NAME=qwenbot-check
VOLUME=qwenbot-check-data
WORK=.cache/container
PODMAN=(podman --runtime runc)
PYTHON=${PYTHON:-.venv/bin/python}
mkdir -p "$WORK"

ok() { printf 'ok: %s\n' "$*"; }
fail() { printf 'FAILED: %s\n' "$*" >&2; "${PODMAN[@]}" logs --tail 30 "$NAME" >&2 2>/dev/null || true; exit 1; }
free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

API_PORT=$(free_port)
METRICS_PORT=$(free_port)
cleanup() {
  "${PODMAN[@]}" rm -f -t 5 "$NAME" >/dev/null 2>&1 || true
  [ -n "${KEEP:-}" ] || "${PODMAN[@]}" volume rm -f "$VOLUME" >/dev/null 2>&1 || true
  [ -z "${FAKE_PID:-}" ] || kill "$FAKE_PID" 2>/dev/null || true
  exec {FAKE_IN}>&- 2>/dev/null || true
}
trap cleanup EXIT
"${PODMAN[@]}" rm -f "$NAME" >/dev/null 2>&1 || true
"${PODMAN[@]}" volume rm -f "$VOLUME" >/dev/null 2>&1 || true

# The fake Bot API as a process on the host: questions in on a pipe, answers out as JSON lines.
mkfifo "$WORK/fake-in" 2>/dev/null || { rm -f "$WORK/fake-in"; mkfifo "$WORK/fake-in"; }
PYTHONPATH=$PWD "$PYTHON" -m tests.fakes.telegram_server --port "$API_PORT" --user-id 1001 --timeout 120 \
  < "$WORK/fake-in" > "$WORK/fake-out" 2> "$WORK/fake-err" &
FAKE_PID=$!
exec {FAKE_IN}> "$WORK/fake-in"
for _ in $(seq 50); do grep -q listening "$WORK/fake-out" 2>/dev/null && break; sleep 0.1; done
TOKEN=$("$PYTHON" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["token"])' "$WORK/fake-out")
ok "fake Bot API on 127.0.0.1:$API_PORT (pid $FAKE_PID)"

start_container() {
  "${PODMAN[@]}" run -d --name "$NAME" --network host --volume "$VOLUME:/app/data" \
    --volume "$PWD/deploy/check/replies.json:/check/replies.json:ro" \
    -e TELEGRAM_BOT_TOKEN="$TOKEN" -e TELEGRAM_BASE_URL="http://127.0.0.1:$API_PORT/bot" \
    -e LLM_BACKEND=scripted -e SCRIPTED_REPLIES_PATH=/check/replies.json -e ALLOWED_USER_IDS=1001 \
    -e METRICS_PORT="$METRICS_PORT" -e LOG_FORMAT=json "$IMAGE" >/dev/null
}

wait_healthy() {  # the image's HEALTHCHECK, run by hand: podman's timers need systemd
  for _ in $(seq 60); do
    if "${PODMAN[@]}" healthcheck run "$NAME" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  return 1
}

ask() {  # ask QUESTION: the answer the fake Bot API saw
  local before
  before=$(wc -l < "$WORK/fake-out")
  echo "$1" >&"$FAKE_IN"
  for _ in $(seq 1300); do
    [ "$(wc -l < "$WORK/fake-out")" -gt "$before" ] && break
    sleep 0.1
  done
  tail -n 1 "$WORK/fake-out"
}

in_container() { "${PODMAN[@]}" exec "$NAME" "$@"; }

start_container
wait_healthy || fail "the healthcheck did not turn healthy within 60 s"
ok "container up and healthy: $("${PODMAN[@]}" inspect "$NAME" --format 'health {{.State.Health.Status}}, image {{.ImageName}}')"
[ "$(in_container id -u)" != 0 ] || fail "the bot runs as root"
ok "runs as $(in_container id -un) (uid $(in_container id -u)), PID 1 is: $(in_container cat /proc/1/cmdline | tr '\0' ' ')"
if in_container .venv/bin/python -c 'import pytest' 2>/dev/null; then fail "pytest is installed in the image"; fi
ok "no test extras in the image (import pytest fails)"

answer=$(ask "请帮我查一下：我们的大模型技术实战课程目前一共上线了多少节？")
echo "   $answer"
grep -q '200' <<<"$answer" || fail "no answer with 200: $answer"
ok "a question through the fake Bot API was answered (tool call course_query, then the final answer)"

"$PYTHON" - "$METRICS_PORT" <<'PY' || fail "/metrics"
import sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
families = {f.name: f for f in text_string_to_metric_families(text)}
names = sorted(n for n in families if n.startswith("qwenbot_") and not n.endswith("_created"))
turns = {s.labels.get("status"): s.value for s in families["qwenbot_turns"].samples if s.name == "qwenbot_turns_total"}
tools = {(s.labels["tool"], s.labels["outcome"]): s.value for s in families["qwenbot_tool_calls"].samples
         if s.name == "qwenbot_tool_calls_total"}
assert turns == {"answered": 1.0}, turns
assert tools == {("course_query", "ok"): 1.0}, tools
print(f"ok: /metrics from the container: {len(names)} qwenbot families, turns {turns}, tool calls {tools}")
PY

in_container .venv/bin/qwenbot backup /app/data/backups/ || fail "backup while running"
backup=$(in_container sh -c 'ls /app/data/backups/*.sqlite3 | head -1')
in_container .venv/bin/python -c "import sqlite3,sys; c = sqlite3.connect(sys.argv[1]); \
assert c.execute('PRAGMA integrity_check').fetchone() == ('ok',); print('   backup holds', c.execute('select count(*) from turns').fetchone()[0], 'turn(s)')" "$backup" \
  || fail "the backup is not whole"
ok "backup taken while the bot runs: $backup"
if restore=$(in_container .venv/bin/qwenbot restore "$backup" 2>&1); then fail "restore ran while the bot serves"; fi
echo "   $restore"
grep -q "is serving the database" <<<"$restore" || fail "restore refused for another reason: $restore"
ok "restore refused while the bot runs"

in_container chmod 0444 /app/data/bot.sqlite3
if "${PODMAN[@]}" healthcheck run "$NAME" >/dev/null 2>&1; then fail "healthy with a read-only database"; fi
echo "   $(in_container .venv/bin/qwenbot health | tr -d '\n' | cut -c1-300)" || true
in_container chmod 0600 /app/data/bot.sqlite3
wait_healthy || fail "not healthy again after the database was made writable"
ok "healthcheck unhealthy while the database was read-only, healthy again after"

"${PODMAN[@]}" stop -t 30 "$NAME" >/dev/null
status=$("${PODMAN[@]}" inspect "$NAME" --format '{{.State.ExitCode}}')
[ "$status" = 0 ] || fail "stopped with exit status $status"
"${PODMAN[@]}" logs "$NAME" 2>&1 | "$PYTHON" -c '
import json, sys
# `qwenbot migrate` prints what it applied on stdout, before the bot starts; the log is everything else.
lines = [line for line in sys.stdin if line.strip() and not line.startswith("applied ")]
entries = [json.loads(line) for line in lines]
first, last = entries[0]["message"], entries[-1]["message"]
print(f"   {len(entries)} log lines, all JSON; first: {first!r}, last: {last!r}")
' || fail "a log line that is not JSON"
ok "SIGTERM stopped it cleanly (exit 0), its log is JSON lines"
"${PODMAN[@]}" rm "$NAME" >/dev/null

start_container
wait_healthy || fail "the second container did not turn healthy"
answer=$(ask "大模型技术实战一共多少节？")
echo "   $answer"
grep -q '200' <<<"$answer" || fail "the second container gave no answer: $answer"
turns=$(in_container .venv/bin/python -c "import sqlite3; print(sqlite3.connect('/app/data/bot.sqlite3').execute('select count(*) from turns').fetchone()[0])")
[ "$turns" = 2 ] || fail "the volume holds $turns turns, not 2"
ok "a new container on the same volume kept the history ($turns turns) and answered"
echo "volume: $("${PODMAN[@]}" volume inspect "$VOLUME" --format '{{.Mountpoint}}'): $(ls "$("${PODMAN[@]}" volume inspect "$VOLUME" --format '{{.Mountpoint}}')" | tr '\n' ' ')"
echo "all checks passed"
