"""The local speech backend (`ASR_BACKEND=local`): faster-whisper (CTranslate2) on a thread of its own.

Transcribing is long CPU work (a second or more per voice note), so it never runs on the event loop, and never on
the model thread either, whose batches other chats are waiting for: one speech thread takes the recordings in
turn, decodes each (agent/speech/audio.py) and transcribes it. The model is loaded there, at the first recording,
so a bot nobody speaks to never loads it. A recording that runs out of time is abandoned at the next segment.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agent.errors import SpeechTimeout, SpeechUnavailable
from agent.speech.audio import Audio, decode_audio
from agent.speech.base import SpeechLimits, Transcriber, Transcript

log = logging.getLogger(__name__)

THREAD_NAME = "speech"


class LocalTranscriber(Transcriber):
    """faster-whisper on this machine, one recording at a time on the speech thread."""

    name = "local"

    def __init__(self, model: str, *, device: str = "cpu", compute_type: str = "int8", cpu_threads: int = 0,
                 language: str = "", beam_size: int = 5, limits: SpeechLimits = SpeechLimits(),
                 base_dir: Path | None = None, cache_dir: Path | None = None):
        self.model_setting = model
        self.device = device
        self.compute_type = compute_type
        self.cpu_threads = cpu_threads
        self.language = language or None  # None: Whisper detects it
        self.beam_size = beam_size
        self.limits = limits
        self.base_dir = base_dir  # where a relative ASR_MODEL folder is looked for (the data directory)
        self.cache_dir = cache_dir  # where a size name or hub id is downloaded to
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)
        self._model: Any = None  # loaded on the speech thread, and only used there

    async def transcribe(self, data: bytes) -> Transcript:
        """Decode and transcribe on the speech thread, within `limits.timeout_seconds` (waiting for the thread
        included)."""
        stop = threading.Event()
        work = asyncio.get_running_loop().run_in_executor(self._executor, self._transcribe, data, stop)
        try:
            return await asyncio.wait_for(work, self.limits.timeout_seconds)
        except TimeoutError:
            raise SpeechTimeout(f"transcribing took longer than {self.limits.timeout_seconds:g} seconds "
                                "(ASR_TIMEOUT_SECONDS)") from None
        finally:
            stop.set()  # a recording abandoned here (time-out, cancelled turn) stops at its next segment

    async def load(self) -> None:
        """Load the model now rather than at the first recording (benchmarks, `qwenbot doctor`)."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self._loaded_model)

    async def close(self) -> None:
        """Let the recording in progress finish, drop the rest, and end the speech thread."""
        await asyncio.get_running_loop().run_in_executor(None, lambda: self._executor.shutdown(cancel_futures=True))

    # --- on the speech thread -------------------------------------------------------------------------------

    def _transcribe(self, data: bytes, stop: threading.Event) -> Transcript:
        if stop.is_set():
            raise SpeechTimeout("the recording waited too long for the speech thread")
        audio = decode_audio(data, self.limits.max_seconds)
        segments, info = self._loaded_model().transcribe(audio.samples, language=self.language,
                                                         beam_size=self.beam_size,
                                                         condition_on_previous_text=False)
        pieces = []
        for segment in segments:  # a generator: each segment is decoded as it is asked for
            if stop.is_set():
                raise SpeechTimeout("transcribing was stopped")
            pieces.append(segment.text.strip())
        return Transcript(_joined(pieces, info.language), info.language, audio.seconds)

    def _loaded_model(self) -> Any:
        if self._model is None:
            self._model = self._load()
        return self._model

    def _load(self) -> Any:
        source = resolve_speech_model(self.model_setting, self.base_dir)
        try:
            from faster_whisper import WhisperModel  # heavy (CTranslate2): only where speech is used

            model = WhisperModel(source, device=self.device, compute_type=self.compute_type,
                                 cpu_threads=self.cpu_threads,
                                 download_root=str(self.cache_dir) if self.cache_dir else None)
        except Exception as error:  # CTranslate2, the hub client and the file system each raise their own
            raise SpeechUnavailable(f"cannot load the speech model {source!r} (ASR_MODEL): "
                                    f"{_one_line(error)}") from None
        log.info("speech model %s loaded (%s, %s)", source, self.device, self.compute_type)
        # Its INFO lines ("Processing audio with duration…") would be two log lines per voice note: the bot logs one.
        logging.getLogger("faster_whisper").setLevel(logging.WARNING)
        return model


def resolve_speech_model(setting: str, base_dir: Path | None) -> str:
    """What faster-whisper loads for ASR_MODEL: a folder (a relative one inside `base_dir`, the data directory)
    when it exists, else a size name (`base`) or hub id (`Systran/faster-whisper-base`) to download. A setting
    that can only be a path, and names no folder, is refused in one line."""
    path = Path(setting).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if path.is_dir():
        return str(path)
    if setting.startswith(("/", ".", "~")) or setting.count("/") > 1:
        raise SpeechUnavailable(f"ASR_MODEL {setting!r} is no folder (scripts/fetch_assets.sh fetches whisper-base "
                                "into .cache/models/whisper-base)")
    return setting


def _joined(pieces: list[str], language: str) -> str:
    """Segments as one text: Chinese and Japanese run on without spaces, other languages take one."""
    separator = "" if language in ("zh", "ja", "yue") else " "
    return separator.join(piece for piece in pieces if piece).strip()


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300] or type(error).__name__


__all__ = ["LocalTranscriber", "resolve_speech_model", "Audio"]
