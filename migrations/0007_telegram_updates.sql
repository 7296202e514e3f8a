-- Telegram updates as received, so that none is lost between Telegram and its answer (at-least-once delivery).
-- An update is written here before Telegram is told it arrived (the next getUpdates offset), and marked handled
-- once its handler ends. After a crash the unhandled ones are handled again; a redelivered one is recognised by
-- its id. Handled rows are pruned after a few days (Telegram keeps unconfirmed updates for 24 hours).
CREATE TABLE telegram_updates (
    update_id INTEGER PRIMARY KEY,
    payload TEXT NOT NULL,                     -- the update's JSON, as Telegram sent it
    received_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    handled_at TEXT                            -- NULL until its handler ended
);
CREATE INDEX telegram_updates_unhandled ON telegram_updates (update_id) WHERE handled_at IS NULL;
