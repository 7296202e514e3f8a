-- The team's own documents (tools/docs_store.py): what was added, its chunks, their full-text index, and room for
-- embeddings later. A document is visible where its scope allows: 'global' (every chat) or one chat key
-- ('tg:<chat_id>', 'cli'). A document is replaced by a new version of the same name in the same scope, keeping its
-- id; its chunks are rewritten in the same transaction.
CREATE TABLE documents (
    id INTEGER PRIMARY KEY AUTOINCREMENT,      -- never reused: a late /doc_del ID cannot hit a newer document
    name TEXT NOT NULL,                        -- the file's name as sent (team-guide.pdf)
    title TEXT NOT NULL,                       -- its first level-1 heading, metadata title, or name without suffix
    kind TEXT NOT NULL,                        -- md, txt, pdf, docx, html…: the suffix it was read as
    size_bytes INTEGER NOT NULL,               -- the file's size as sent
    text_bytes INTEGER NOT NULL,               -- the text kept from it (UTF-8): what DOCS_MAX_TOTAL_MB counts
    sha256 TEXT NOT NULL,                      -- of the file's bytes: the same file added again changes nothing
    chunk_count INTEGER NOT NULL,
    scope TEXT NOT NULL DEFAULT 'global',
    added_by INTEGER,                          -- a Telegram user id; NULL from `qwenbot docs add`
    added_by_name TEXT NOT NULL DEFAULT '',
    added_in INTEGER,                          -- the chat it was sent in
    added_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    UNIQUE (scope, name)
);
CREATE INDEX documents_by_hash ON documents (sha256, scope);

-- Each document cut by headings and paragraphs (tools/docs_chunks.py): `heading` is the path above the text
-- ("Guide › Setup › Tokens"), `position` its order in the document (neighbours are position ± 1).
CREATE TABLE document_chunks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,      -- never reused: a chunk id the model saw names that chunk or none
    document_id INTEGER NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    heading TEXT NOT NULL,
    body TEXT NOT NULL,
    UNIQUE (document_id, position)
);

-- The full-text index, one row per chunk (rowid = document_chunks.id), written by the library in the form of
-- tools/docs_index.py's DEFAULT_FORM: unicode61 over text whose runs of Chinese characters are rewritten as
-- overlapping pairs (measured against FTS5's trigram tokenizer on evals/docs.jsonl: bench/README.md, "Documents").
-- It keeps its own copy of that text; BM25 ranks the matches.
CREATE VIRTUAL TABLE document_index USING fts5(heading, body, tokenize = 'porter unicode61 remove_diacritics 2');

-- The extension point for hybrid ranking, not used yet: one embedding per chunk from an OpenAI-compatible
-- /embeddings server (`model` names it; `vector` holds `dims` little-endian float32 values). A ranker may then
-- merge the nearest chunks by vector with BM25's (e.g. reciprocal rank fusion). Rows go with their chunk.
CREATE TABLE document_chunk_vectors (
    chunk_id INTEGER PRIMARY KEY REFERENCES document_chunks (id) ON DELETE CASCADE,
    model TEXT NOT NULL,
    dims INTEGER NOT NULL,
    vector BLOB NOT NULL
);
