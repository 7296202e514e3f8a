"""Errors raised by the agent and its model backends (the whole tree, with its root, is drawn in core/errors.py).

    AgentError                 base of everything below
    └── LLMError               a backend could not produce a completion
        ├── ModelLoadError     the model or tokenizer cannot be loaded (bad path, no chat template)
        ├── LLMTimeout         the backend did not answer in time
        ├── LLMCancelled       the request was cancelled (/cancel, or the turn timed out)
        └── LLMOutOfMemory     the device ran out of memory for this request

Errors the *model* causes (bad format, unknown tool, bad arguments) are not exceptions: they go back
to the model as observations. These exceptions are for failures the model cannot fix.
"""


from core.errors import BotError


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
