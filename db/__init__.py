"""The database: one SQLite file (WAL), the process's write lock, and the migrations applied on open."""

from db.connection import Database, open_database
from db.errors import BotError, DatabaseBusy, DatabaseError, DatabaseOpenError, MigrationError
from db.migrate import apply_migrations

__all__ = ["BotError", "Database", "DatabaseBusy", "DatabaseError", "DatabaseOpenError", "MigrationError",
           "apply_migrations", "open_database"]
