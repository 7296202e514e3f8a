-- Conversations that last (issue 40).
--
-- A running summary per session: the oldest turns of a long history, folded by the model. The history window
-- starts after `through_turn_id`; the folded turns' messages stay (for /export) until /reset deletes them with it.
CREATE TABLE session_summaries (
    session_id TEXT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
    summary TEXT NOT NULL,
    through_turn_id INTEGER NOT NULL,          -- the newest turn folded into the summary
    folded_turns INTEGER NOT NULL DEFAULT 0,   -- how many turns it holds in all
    language TEXT NOT NULL DEFAULT 'en',       -- 'zh' or 'en': the chat's language, which it is written in
    updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- Per-user daily limits set by admins (/quota_set), over USER_DAILY_TURNS and USER_DAILY_TOKENS; 0 = unlimited.
CREATE TABLE user_quotas (
    user_id INTEGER NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('turns', 'tokens')),
    daily_limit INTEGER NOT NULL CHECK (daily_limit >= 0),
    set_by INTEGER,
    updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (user_id, kind)
);

-- Quotas count a user's turns and tokens of the day from the turns table.
CREATE INDEX turns_by_user ON turns (user_id, started_at);

-- Personas live in chat_options (name 'persona', value the persona's text), beside the other per-chat options.
