"""Errors raised by the agent and its model backends (the whole tree, with its root, is drawn in core/errors.py).

    AgentError                 base of everything below
    ├── LLMError               a backend could not produce a completion
    │   ├── ModelLoadError     the model or tokenizer cannot be loaded (bad path, no chat template)
    │   ├── LLMTimeout         the backend did not answer in time
    │   ├── LLMCancelled       the request was cancelled (/cancel, or the turn timed out)
    │   └── LLMOutOfMemory     the device ran out of memory for this request
    └── TurnNotSaved           the turn has its answer, but another process held the database when it was to be
                               stored (also a sqlite3.OperationalError, as db's DatabaseBusy is): it carries the
                               result and a way to store it later

Errors the *model* causes (bad format, unknown tool, bad arguments) are not exceptions: they go back
to the model as observations. These exceptions are for failures the model cannot fix.
"""


import sqlite3
from typing import TYPE_CHECKING, Awaitable, Callable

from core.errors import BotError

if TYPE_CHECKING:
    from agent.steps import TurnResult


class AgentError(BotError):
    """Base class for agent errors."""


class LLMError(AgentError):
    """A backend could not produce a completion."""


class ModelLoadError(LLMError):
    """The model or its tokenizer cannot be loaded."""


class LLMTimeout(LLMError):
    """The backend did not answer in time."""


class LLMCancelled(LLMError):
    """The request was cancelled before it finished."""


class LLMOutOfMemory(LLMError):
    """The device ran out of memory while generating."""


class TurnNotSaved(AgentError, sqlite3.OperationalError):
    """The turn ended with `result`, but another process held the database past the busy timeout when it was to
    be stored. Nothing of it is stored yet; `save()` stores it (turn, steps and history, in one transaction) and
    returns its id, so the caller can deliver the answer first and store it once the database frees."""

    def __init__(self, message: str, result: "TurnResult", save: Callable[[], Awaitable[int]]):
        super().__init__(message)
        self.result = result
        self.save = save
