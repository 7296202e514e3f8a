-- Per-chat agent options set by admins, on top of their Settings defaults: scope 'global' or a chat key
-- ('tg:<chat_id>', 'cli'); a chat's row wins over global. `name` is an option ('require_tool_call'), `value` its
-- text ('on'/'off').
CREATE TABLE chat_options (
    scope TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (scope, name)
);
