-- One row, written by every health check (/healthz, the systemd watchdog) on a connection of its own: a database
-- that stops taking writes (a read-only file or mount, a full disk, a lock held for good) fails the check before a
-- turn meets it. `checked_at` says when the bot last found itself healthy.
CREATE TABLE health_checks (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    checked_at TEXT NOT NULL
);
