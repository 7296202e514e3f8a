"""The database's schema, as ordered `NNNN_name.sql` files; db/migrate.py applies each once, in its own transaction.

A file is never edited after it lands (a database out there has applied it as it was): a fix is a new file with
the next number. This folder is a package only so that an installed copy ships the files beside the code and
the runner finds them the same way from a clone and from a wheel (`FOLDER`).
"""

from pathlib import Path

FOLDER = Path(__file__).resolve().parent
