-- Chat sessions and their message history (what the model sees of earlier turns).
-- A session is one history: a private chat, a group, a forum topic, or a terminal session.
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,                       -- e.g. 'tg:-100123:7' (chat and topic) or 'cli:default'
    chat_id INTEGER,                           -- Telegram chat id, NULL outside Telegram
    kind TEXT NOT NULL DEFAULT 'private',      -- private, group, supergroup, channel, cli
    title TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    turn_id INTEGER,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX messages_by_session ON messages (session_id, id);
