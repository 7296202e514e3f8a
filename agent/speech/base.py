"""The one small interface every speech backend implements: a recording's bytes in, its transcript out.

A transcriber decodes the file itself (agent/speech/audio.py) off the event loop, refuses a recording over its
duration limit before transcribing it, and raises only `SpeechError`s (agent/errors.py), each one line a user or
the command line can be shown.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class SpeechLimits:
    """The limits of a voice question. These defaults are the only ones: `Settings` takes its defaults from here."""

    max_seconds: float = 120.0  # a longer recording is refused before it is transcribed
    max_file_mb: float = 20.0  # Telegram's Bot API hands out files up to 20 MB
    timeout_seconds: float = 120.0  # local backend: waiting for the speech thread and transcribing, together


@dataclass(frozen=True)
class Transcript:
    """What was said, in which language (Whisper's code: 'en', 'zh'; '' when the backend does not say), and how
    long the recording was."""

    text: str
    language: str
    audio_seconds: float


class Transcriber(ABC):
    """A speech-to-text backend."""

    name: str = "speech"

    @abstractmethod
    async def transcribe(self, data: bytes) -> Transcript:
        """The transcript of the recording in `data` (any format PyAV reads). Raises `SpeechError`s: `NotAudio`,
        `AudioTooLong`, `SpeechTimeout`, `SpeechUnavailable`."""

    async def close(self) -> None:
        """Release the model or the connections."""
