-- Each piece of an answer Telegram took, written the moment it went through (bot/telegram/deliveries.py). An
-- update handled again after a crash (kill -9 between the send and the journal's "handled") sends only the pieces
-- not listed here, so an answer that went out is not sent twice. Kept as long as the journal keeps its update.
CREATE TABLE answer_deliveries (
    source_key TEXT NOT NULL,                  -- the turn's key (turns.source_key): its update's journal key
    piece INTEGER NOT NULL,                    -- 0 for the first 4096-character piece of the answer
    chat_id INTEGER NOT NULL,
    message_id INTEGER NOT NULL,               -- the message Telegram made of it
    delivered_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (source_key, piece)
);

-- Update ids start over when a Bot API server restarts without its state (a local server's queue starts at a
-- random id; Telegram's own after a week without updates). Each start over is an epoch of the journal's source
-- (bot/telegram/intake.py): the first keeps the source's name, later ones add '#<epoch>', so their ids, and the
-- keys of the turns they ask for, never meet the earlier ones'. `high_water` is the highest id journaled in the
-- current epoch; it outlives the journal's pruning.
CREATE TABLE update_epochs (
    base TEXT PRIMARY KEY,                     -- '<bot id>@<Bot API base URL>', as the journal's source
    epoch INTEGER NOT NULL DEFAULT 1,
    high_water INTEGER,
    started_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
