"""The root of every error a user or the command line may see, and the whole tree drawn in one place.

The root lives here, in a package that imports nothing of the project, so that every package derives from it
without importing another (the engine loads no database, the database no agent); each package's `errors.py` holds
its own branch. `qwenbot` turns any `BotError` into one line on stderr, and the Telegram handlers turn the ones a
turn can meet into a short apology.

    BotError                         (here)
    ├── ConfigError                  a setting the bot cannot use; names the variable (bot/program/env.py)
    ├── EvalFileError                a question file `qwenbot eval` cannot read; names the line (bot/program/evaluation.py)
    ├── DatabaseError                the database cannot do what was asked (db/errors.py)
    │   ├── DatabaseOpenError        the path is a folder, not SQLite, or not writable (also an OSError)
    │   ├── MigrationError           a migration file failed and was rolled back
    │   ├── DatabaseBusy             another process held the write lock past the busy timeout
    │   │                            (also a sqlite3.OperationalError)
    │   ├── DatabaseInUse            another `qwenbot run` serves the database (db/instance_lock.py)
    │   ├── DatabaseGone             the file was deleted or replaced while the process had it open
    │   ├── BackupError              a backup cannot be written, or a file cannot be restored (db/backup.py)
    │   ├── DatabaseMissing          no database where its marker says one was created (db/marker.py)
    │   └── SecretKeyError           the key that seals secrets at rest is unusable, or not the one used
    ├── ToolError                    a tool refuses its input; the model reads it (tools/errors.py)
    │   ├── UnknownTool              no tool of that name (also a KeyError)
    │   ├── CalculationError
    │   ├── CourseError
    │   └── McpToolError             an MCP tool answered with an error, or its server refused the call
    │       └── ServerUnavailable    the MCP server cannot be reached or hung up
    ├── ConfirmationNeeded           enabling a tool that may change data needs the admin's flag (tools/errors.py)
    ├── McpConfigError               an MCP server definition cannot be used (tools/errors.py)
    │   └── PrivateAddress           an admin-added server resolves to a non-public address
    └── AgentError                   (agent/errors.py)
        ├── LLMError                 a backend could not produce a completion
        │   ├── ModelLoadError
        │   ├── LLMTimeout
        │   ├── LLMCancelled
        │   ├── LLMOutOfMemory
        │   └── ImagesRefused        the model server refused a picture (a text-only model)
        ├── SpeechError              a recording could not be turned into text (agent/speech/)
        │   ├── NotAudio
        │   ├── AudioTooLong
        │   ├── SpeechTimeout
        │   └── SpeechUnavailable
        ├── NotAnImage               a picture that cannot be read (agent/images.py)
        └── TurnNotSaved             the turn's answer is there, but storing it met a busy database
                                     (also a sqlite3.OperationalError); it carries a way to store it later
"""


class BotError(Exception):
    """Base of every error a user or the command line may see."""
