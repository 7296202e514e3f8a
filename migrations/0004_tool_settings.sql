-- Which tools are enabled: scope 'global', or a chat key ('tg:<chat_id>', 'cli'). A chat's row wins over global.
CREATE TABLE tool_settings (
    scope TEXT NOT NULL,
    tool_name TEXT NOT NULL,
    enabled INTEGER NOT NULL CHECK (enabled IN (0, 1)),
    updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (scope, tool_name)
);
