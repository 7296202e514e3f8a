-- MCP servers admins connect at run time (/mcp_add, `qwenbot mcp add`): streamable HTTP or SSE only. Servers over
-- stdio run a command, so they are declared only in the file at MCP_CONFIG_PATH, never here.
CREATE TABLE mcp_servers (
    name TEXT PRIMARY KEY,                     -- the prefix of its tools' names: NAME.tool
    transport TEXT NOT NULL CHECK (transport IN ('http', 'sse')),
    url TEXT NOT NULL,
    headers TEXT NOT NULL DEFAULT '{}',        -- a JSON object; the values are secrets, never shown or logged
    added_by INTEGER,
    added_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
-- Each server's last tool listing (admin-added or from the config file): a server that is down at start still
-- offers its tools (a call then says it is down), and `qwenbot tools` lists them without connecting.
CREATE TABLE mcp_tools (
    server TEXT NOT NULL,
    name TEXT NOT NULL,                        -- the server's own name for the tool
    title TEXT NOT NULL DEFAULT '',
    description TEXT NOT NULL DEFAULT '',
    input_schema TEXT NOT NULL,                -- JSON Schema of the arguments, as listed
    read_only INTEGER NOT NULL CHECK (read_only IN (0, 1)),
    destructive INTEGER NOT NULL CHECK (destructive IN (0, 1)),
    listed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (server, name)
);
