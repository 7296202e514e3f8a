"""The speech backend of a server (`ASR_BACKEND=openai`): any OpenAI-compatible `POST /audio/transcriptions`
(vLLM serving a Whisper model, faster-whisper-server, whisper.cpp's server, OpenAI itself).

The recording is decoded here first (off the event loop), so the duration limit holds before anything is sent and
a file that is not audio never reaches the server; what is sent is 16 kHz mono WAV, the one format all of these
servers read (whisper.cpp's reads nothing else unless started with --convert). The call runs under the chat
backend's limits: the connection must open within the connect limit, and the transcript must arrive within the
first-token limit, the client's own retries included.
"""

from __future__ import annotations

import asyncio
import re

import httpx
import openai
from openai import AsyncOpenAI

from agent.errors import SpeechTimeout, SpeechUnavailable
from agent.llm.openai_stream import ServerLimits, StreamLimits
from agent.speech.audio import decode_audio
from agent.speech.base import SpeechLimits, Transcriber, Transcript

MAX_MESSAGE_CHARS = 300  # a server's error text is cut to this, so our error stays one readable line


class OpenAITranscriber(Transcriber):
    """A client of an OpenAI-compatible transcription endpoint."""

    name = "openai"

    def __init__(self, *, base_url: str, model: str, api_key: str = "EMPTY", language: str = "",
                 limits: SpeechLimits = SpeechLimits(), time_limits: StreamLimits = StreamLimits(),
                 max_retries: int = ServerLimits.max_retries):
        self.base_url = base_url
        self.model = model
        self.language = language
        self.limits = limits
        self.time_limits = time_limits
        self._api_key = api_key or "EMPTY"
        self._client = AsyncOpenAI(base_url=base_url, api_key=self._api_key, max_retries=max_retries,
                                   timeout=httpx.Timeout(time_limits.first_token_seconds,
                                                         connect=time_limits.connect_seconds))

    async def transcribe(self, data: bytes) -> Transcript:
        """Decode, check the duration, send the WAV, and read the server's transcript (see the module docstring)."""
        audio = await asyncio.to_thread(decode_audio, data, self.limits.max_seconds)
        answer_seconds = self.time_limits.first_token_seconds
        try:
            async with asyncio.timeout(answer_seconds):
                result = await self._client.audio.transcriptions.create(
                    model=self.model, file=("voice.wav", audio.wav_bytes(), "audio/wav"), response_format="json",
                    **({"language": self.language} if self.language else {}))
        except (TimeoutError, openai.APITimeoutError):
            raise SpeechTimeout(f"the transcription server at {self.base_url} sent no transcript within "
                                f"{answer_seconds:g} s (OPENAI_FIRST_TOKEN_SECONDS)") from None
        except openai.APIConnectionError as error:
            raise SpeechUnavailable(f"cannot reach the transcription server at {self.base_url}: "
                                    f"{self._one_line(str(error.__cause__ or error))}") from None
        except openai.APIStatusError as error:
            body = error.body
            said = (body.get("message") if isinstance(body, dict) else body) or error.message
            raise SpeechUnavailable(f"the transcription server at {self.base_url} answered {error.status_code}: "
                                    f"{self._one_line(str(said))}") from None
        text = str(getattr(result, "text", "") or "").strip()
        return Transcript(text, str(getattr(result, "language", "") or ""), audio.seconds)

    async def close(self) -> None:
        """Close the client's connections."""
        await self._client.close()

    def _one_line(self, text: str) -> str:
        """Collapse whitespace, cut to a readable length, and never repeat the API key a server echoed back."""
        if self._api_key != "EMPTY":
            text = text.replace(self._api_key, "***")
        text = re.sub(r"\s+", " ", text).strip()
        return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"
