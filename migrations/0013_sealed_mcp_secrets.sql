-- MCP servers' secrets leave the database's plain columns (issue 43). `sealed` holds a server's URL and headers,
-- encrypted with the key in SECRETS_KEY_PATH (db/secret_box.py), a file outside the database; `url` then holds
-- the URL as it may be shown (no user:password, query values masked) and `headers` the header names with empty
-- values. SQL has no key, so rows written before this migration keep their plain values here, with no `sealed`:
-- the next start seals them (tools/mcp_store.py, `seal_plain_servers`) and zeroes what they held.
ALTER TABLE mcp_servers ADD COLUMN sealed TEXT;
