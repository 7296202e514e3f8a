-- Every finished turn and its steps, kept for /trace, /stats and audit (a /reset does not delete them).
CREATE TABLE turns (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    user_id INTEGER,
    source_key TEXT UNIQUE,                    -- e.g. the Telegram update id: a redelivered update is stored once
    question TEXT NOT NULL,
    answer TEXT NOT NULL,
    status TEXT NOT NULL,                      -- answered, step_limit, gave_up, error, cancelled
    mode TEXT NOT NULL DEFAULT 'react',
    model_calls INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    started_at TEXT NOT NULL,
    duration_ms INTEGER NOT NULL
);
CREATE INDEX turns_by_session ON turns (session_id, id);
CREATE INDEX turns_by_start ON turns (started_at);

CREATE TABLE steps (
    id INTEGER PRIMARY KEY,
    turn_id INTEGER NOT NULL REFERENCES turns(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    kind TEXT NOT NULL,                        -- tool, final, format_error, repeated, limit
    thought TEXT NOT NULL DEFAULT '',
    action TEXT NOT NULL DEFAULT '',
    action_input TEXT NOT NULL DEFAULT '',
    observation TEXT NOT NULL DEFAULT '',
    error TEXT,                                -- unknown_tool, invalid_arguments, exception, timeout, parse
    duration_ms INTEGER NOT NULL DEFAULT 0,
    UNIQUE (turn_id, position)
);
