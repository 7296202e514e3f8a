"""Decoding a recording to what Whisper hears: 16 kHz mono samples, with PyAV (FFmpeg's libraries, bundled in its
wheel; no ffmpeg program needed), as faster-whisper itself decodes.

Telegram sends voice notes as OGG/Opus, audio files as MP3 or M4A, video notes as MP4 with an AAC track: PyAV reads
them all. Decoding stops as soon as the recording passes the duration limit, so an over-long file costs no more
than the limit to refuse.
"""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass

import av
import numpy as np

from agent.errors import AudioTooLong, NotAudio

SAMPLE_RATE = 16_000  # what Whisper models take


@dataclass(frozen=True)
class Audio:
    """A decoded recording: float32 samples in [-1, 1], mono, at SAMPLE_RATE."""

    samples: np.ndarray

    @property
    def seconds(self) -> float:
        """How long the recording is."""
        return len(self.samples) / SAMPLE_RATE

    def wav_bytes(self) -> bytes:
        """The recording as a 16-bit PCM WAV file: the one format every transcription server reads."""
        pcm = (np.clip(self.samples, -1.0, 1.0) * 32767).astype("<i2")
        buffer = io.BytesIO()
        with wave.open(buffer, "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(SAMPLE_RATE)
            out.writeframes(pcm.tobytes())
        return buffer.getvalue()


def decode_audio(data: bytes, max_seconds: float) -> Audio:
    """The first audio stream of `data` (any container PyAV reads), resampled to 16 kHz mono.

    Raises `NotAudio` for a file with no readable audio, `AudioTooLong` once more than `max_seconds` is decoded.
    """
    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise NotAudio("the file has no audio track")
            return Audio(_resampled(container, container.streams.audio[0], max_seconds))
    except av.FFmpegError as error:
        raise NotAudio(f"not a recording the decoder can read ({_one_line(error)})") from None


def _resampled(container: av.container.InputContainer, stream: av.AudioStream, max_seconds: float) -> np.ndarray:
    resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
    limit = int(max_seconds * SAMPLE_RATE)
    chunks: list[np.ndarray] = []
    total = 0
    for frame in container.decode(stream):
        for piece in resampler.resample(frame):
            chunk = piece.to_ndarray().reshape(-1)
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise AudioTooLong(f"the recording is longer than {max_seconds:g} seconds")
    for piece in resampler.resample(None):  # what the resampler still holds
        chunks.append(piece.to_ndarray().reshape(-1))
    samples = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
    if len(samples) > limit:
        raise AudioTooLong(f"the recording is longer than {max_seconds:g} seconds")
    if not len(samples):
        raise NotAudio("the audio track is empty")
    return samples.astype(np.float32) / 32768.0


def _one_line(error: av.FFmpegError) -> str:
    reason = getattr(error, "strerror", None) or str(error)  # FFmpeg's own words, without its errno and file name
    return " ".join(str(reason).split())[:200] or type(error).__name__
