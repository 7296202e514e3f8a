-- Every change an admin makes, who made it and where.
CREATE TABLE audit_log (
    id INTEGER PRIMARY KEY,
    at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    user_id INTEGER,
    chat_id INTEGER,
    action TEXT NOT NULL,                      -- e.g. tool_off, course_set, allow
    detail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX audit_log_by_time ON audit_log (at);
