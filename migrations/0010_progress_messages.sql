-- Progress messages ("⏳ 正在思考…") on screen while a turn runs: written when one is sent, removed when it is
-- deleted. A process killed mid-turn never deletes its own, so the next start deletes whatever is still listed.
CREATE TABLE progress_messages (
    chat_id INTEGER NOT NULL,
    message_id INTEGER NOT NULL,
    sent_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (chat_id, message_id)
);
