"""The database: one SQLite file (WAL), the process's write lock, the instance lock of the serving process, and
the migrations applied on open."""

from db.connection import Database, open_database
from db.errors import (BackupError, DatabaseBusy, DatabaseError, DatabaseGone, DatabaseInUse, DatabaseMissing,
                       DatabaseOpenError,
                       MigrationError)
from db.instance_lock import InstanceLock, serving_pid
from db.migrate import apply_migrations

__all__ = ["BackupError", "Database", "DatabaseBusy", "DatabaseError", "DatabaseGone", "DatabaseInUse",
           "DatabaseMissing",
           "DatabaseOpenError", "InstanceLock", "MigrationError", "apply_migrations", "open_database", "serving_pid"]
