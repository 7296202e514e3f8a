"""The database: ordered SQL migrations, their runner, and the migrated connection the bot shares."""

from migrations.database import Database, DatabaseOpenError, open_database
from migrations.runner import MigrationError, apply_migrations

__all__ = ["Database", "DatabaseOpenError", "MigrationError", "apply_migrations", "open_database"]
