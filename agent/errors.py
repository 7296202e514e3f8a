"""Errors raised by the agent and its model backends (the whole tree, with its root, is drawn in core/errors.py).

    AgentError                 base of everything below
    ├── LLMError               a backend could not produce a completion
    │   ├── ModelLoadError     the model or tokenizer cannot be loaded (bad path, no chat template)
    │   ├── LLMTimeout         the backend did not answer in time
    │   ├── LLMCancelled       the request was cancelled (/cancel, or the turn timed out)
    │   ├── LLMOutOfMemory     the device ran out of memory for this request
    │   └── ImagesRefused      the model server refused a request carrying a picture (a text-only model)
    ├── SpeechError            a recording could not be turned into text (agent/speech/)
    │   ├── NotAudio           the file holds no audio the decoder can read
    │   ├── AudioTooLong       longer than the duration limit, or larger than the file-size limit
    │   ├── SpeechTimeout      the transcriber did not finish in time
    │   └── SpeechUnavailable  the speech model cannot be loaded, or its server failed or cannot be reached
    ├── NotAnImage             a picture that cannot be read, or is far too large (agent/images.py)
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


class ImagesRefused(LLMError):
    """The model server answered a request that carried a picture with a refusal: the model reads text only."""


class SpeechError(AgentError):
    """A recording could not be turned into text; the message is one line fit for a log or the command line."""


class NotAudio(SpeechError):
    """The file holds no audio stream the decoder can read."""


class AudioTooLong(SpeechError):
    """The recording is longer than the duration limit, or its file larger than the size limit."""


class SpeechTimeout(SpeechError):
    """The transcriber did not finish in time."""


class SpeechUnavailable(SpeechError):
    """The speech model cannot be loaded, or its server failed or cannot be reached."""


class NotAnImage(AgentError):
    """A picture that cannot be read, or whose size is far beyond any use."""


class TurnNotSaved(AgentError, sqlite3.OperationalError):
    """The turn ended with `result`, but another process held the database past the busy timeout when it was to
    be stored. Nothing of it is stored yet; `save()` stores it (turn, steps and history, in one transaction) and
    returns its id, so the caller can deliver the answer first and store it once the database frees."""

    def __init__(self, message: str, result: "TurnResult", save: Callable[[], Awaitable[int]]):
        super().__init__(message)
        self.result = result
        self.save = save
