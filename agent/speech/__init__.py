"""Speech to text for questions asked by voice: decoding a recording (audio.py), and the transcribers behind one
small interface (base.py): faster-whisper on its own thread (local.py), or an OpenAI-compatible
`/audio/transcriptions` server (openai.py)."""

from agent.speech.base import SpeechLimits, Transcriber, Transcript

__all__ = ["SpeechLimits", "Transcriber", "Transcript"]
