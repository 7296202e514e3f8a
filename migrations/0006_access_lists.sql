-- Users and chats allowed (or denied) at run time by admins, on top of ALLOWED_USER_IDS / ALLOWED_CHAT_IDS.
CREATE TABLE access_list (
    kind TEXT NOT NULL CHECK (kind IN ('user', 'chat')),
    subject_id INTEGER NOT NULL,
    allowed INTEGER NOT NULL CHECK (allowed IN (0, 1)),
    changed_by INTEGER,
    changed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (kind, subject_id)
);
