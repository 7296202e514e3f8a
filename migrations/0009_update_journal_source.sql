-- The update journal belongs to one bot at one Bot API server. Update ids are only unique there: pointed at
-- another server (a local Bot API server reinstalled, a test server) or given another bot's token, ids start
-- again at 1, and a journal keyed by the id alone took every new update for one already seen and dropped it.
-- `source` is '<bot id>@<Bot API base URL>'; rows from before this migration get '' and are claimed by the
-- next start (bot/intake.py), which is the bot they came from unless the token or URL changed with the upgrade.
CREATE TABLE telegram_updates_by_source (
    source TEXT NOT NULL,
    update_id INTEGER NOT NULL,
    payload TEXT NOT NULL,                     -- the update's JSON, as Telegram sent it
    received_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    handled_at TEXT,                           -- NULL until its handler ended
    PRIMARY KEY (source, update_id)
);
INSERT INTO telegram_updates_by_source (source, update_id, payload, received_at, handled_at)
    SELECT '', update_id, payload, received_at, handled_at FROM telegram_updates;
DROP TABLE telegram_updates;
ALTER TABLE telegram_updates_by_source RENAME TO telegram_updates;
CREATE INDEX telegram_updates_unhandled ON telegram_updates (source, update_id) WHERE handled_at IS NULL;
