"""Speech to text below the bot: decoding recordings with PyAV, the local faster-whisper backend on its own thread
(with the real whisper-base weights), the OpenAI-compatible backend against a fake /audio/transcriptions server,
and `qwenbot transcribe`."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import re
import subprocess
import sys
import threading
import wave
from pathlib import Path

import pytest
from PIL import Image

from agent.errors import AudioTooLong, NotAudio, SpeechTimeout, SpeechUnavailable
from agent.llm.openai_stream import StreamLimits
from agent.speech.audio import SAMPLE_RATE, decode_audio
from agent.speech.base import SpeechLimits
from agent.speech.local import LocalTranscriber, resolve_speech_model
from agent.speech.openai import OpenAITranscriber
from bot.program.config import Settings
from bot.program.services import build_transcriber
from tests.fakes.openai_server import HANG, FakeOpenAIServer, error
from tests.real_speech import QUESTION_EN, ROOT, real_asr_test, recording, whisper_folder

EN_SECONDS = 2.867  # opusinfo's playback length of question_en.ogg: the recording's length, not a time taken


def png_bytes() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buffer, "PNG")
    return buffer.getvalue()


# --- decoding ----------------------------------------------------------------------------------------------------

def test_a_telegram_voice_note_decodes_to_16_khz_mono_of_its_length():
    audio = decode_audio(recording("question_en.ogg"), max_seconds=60)
    assert audio.samples.dtype.name == "float32" and audio.samples.ndim == 1
    assert abs(audio.seconds - EN_SECONDS) < 0.03
    assert 0.1 < float(abs(audio.samples).max()) <= 1.0  # speech, not silence, and in range


def test_the_wav_sent_to_servers_is_16_khz_mono_16_bit_and_decodes_back_to_the_same_length():
    audio = decode_audio(recording("question_en.ogg"), max_seconds=60)
    wav = audio.wav_bytes()
    with wave.open(io.BytesIO(wav)) as file:
        assert (file.getnchannels(), file.getsampwidth(), file.getframerate()) == (1, 2, SAMPLE_RATE)
        assert file.getnframes() == len(audio.samples)
    assert len(decode_audio(wav, max_seconds=60).samples) == len(audio.samples)


@pytest.mark.parametrize("data, says", [
    pytest.param(b"How many lessons? (typed, not said)", "not a recording", id="text"),
    pytest.param(b"", "not a recording", id="empty-file"),
    pytest.param(png_bytes(), "no audio track", id="a-picture"),
    pytest.param(recording("question_en.ogg")[:200], "", id="cut-off-after-its-header"),
])
def test_what_is_not_audio_is_refused_in_one_line(data, says):
    with pytest.raises(NotAudio) as refused:
        decode_audio(data, max_seconds=60)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_a_recording_over_the_limit_is_refused_while_decoding():
    with pytest.raises(AudioTooLong, match="longer than 2 seconds"):
        decode_audio(recording("question_en.ogg"), max_seconds=2)


# --- which model the local backend loads ---------------------------------------------------------------------------

def test_the_speech_model_setting_names_a_folder_in_the_data_dir_a_size_or_a_hub_id(tmp_path):
    (tmp_path / "whisper-base").mkdir()
    assert resolve_speech_model("whisper-base", tmp_path) == str(tmp_path / "whisper-base")
    assert resolve_speech_model("base", tmp_path) == "base"
    assert resolve_speech_model("Systran/faster-whisper-small", tmp_path) == "Systran/faster-whisper-small"
    with pytest.raises(SpeechUnavailable, match="is no folder"):
        resolve_speech_model(str(tmp_path / "missing"), tmp_path)


async def test_a_speech_model_that_cannot_be_loaded_is_one_line_at_the_first_recording(tmp_path):
    broken = tmp_path / "whisper-broken"
    broken.mkdir()
    (broken / "model.bin").write_bytes(b"not a model")
    transcriber = LocalTranscriber(str(broken))
    try:
        with pytest.raises(SpeechUnavailable, match="cannot load the speech model") as failed:
            await transcriber.transcribe(recording("question_en.ogg"))
        assert "\n" not in str(failed.value)
    finally:
        await transcriber.close()


def test_asr_backend_auto_is_local_where_faster_whisper_is_installed_and_off_turns_speech_off(tmp_path):
    assert isinstance(build_transcriber(Settings.of(data_dir=tmp_path)), LocalTranscriber)
    assert build_transcriber(Settings.of(data_dir=tmp_path, asr_backend="off")) is None
    server = build_transcriber(Settings.of(data_dir=tmp_path, asr_backend="openai", asr_model="whisper-1",
                                           openai_base_url="http://127.0.0.1:9/v1"))
    assert isinstance(server, OpenAITranscriber) and server.base_url == "http://127.0.0.1:9/v1"


# --- the local backend, for real -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def local_transcriber():
    transcriber = LocalTranscriber(str(whisper_folder()), cpu_threads=2)
    yield transcriber
    asyncio.run(transcriber.close())


@real_asr_test
async def test_whisper_base_transcribes_the_english_question_word_for_word(local_transcriber, caplog):
    with caplog.at_level(logging.INFO, logger="agent.speech.local"):
        transcript = await local_transcriber.transcribe(recording("question_en.ogg"))
    assert transcript.text == QUESTION_EN
    assert transcript.language == "en" and abs(transcript.audio_seconds - EN_SECONDS) < 0.03
    # The model was loaded, and the recording transcribed, on the speech thread: not this event loop's thread
    # (and not the model thread, which the local chat engine names otherwise).
    loaded = [record for record in caplog.records if "speech model" in record.getMessage()]
    assert [record.threadName.split("_")[0] for record in loaded] == ["speech"]
    assert loaded[0].thread != threading.get_ident()


@real_asr_test
async def test_whisper_base_detects_chinese_and_writes_chinese(local_transcriber):
    # The Chinese sample is synthetic speech that whisper-base understands only in part (tests/data/README.md), so
    # its words are not asserted: whisper's temperature fallback samples at random on unclear audio, and a run
    # heard "学习…多少" where another heard "記記學…以光". What must hold is the language and the script.
    transcript = await local_transcriber.transcribe(recording("question_zh.ogg"))
    assert transcript.language == "zh"
    han = [c for c in transcript.text if "\u4e00" <= c <= "\u9fff"]
    assert len(han) >= 4 and not re.search(r"[A-Za-z]{3,}", transcript.text)


@real_asr_test
async def test_a_file_that_is_not_audio_is_refused_before_the_model_sees_it(local_transcriber):
    with pytest.raises(NotAudio):
        await local_transcriber.transcribe(b"definitely not a recording")


async def test_a_recording_waiting_too_long_for_the_speech_thread_times_out_in_one_line(tmp_path):
    transcriber = LocalTranscriber(str(tmp_path / "never-loaded"), limits=SpeechLimits(timeout_seconds=0.05))
    blocker = threading.Event()
    transcriber._executor.submit(blocker.wait, 5)  # the speech thread is busy with someone else's recording
    try:
        with pytest.raises(SpeechTimeout, match="ASR_TIMEOUT_SECONDS"):
            await transcriber.transcribe(recording("question_en.ogg"))
    finally:
        blocker.set()
        await transcriber.close()


# --- the openai backend against a fake server ----------------------------------------------------------------------

@pytest.fixture
def server():
    with FakeOpenAIServer() as fake:
        yield fake


def server_transcriber(server: FakeOpenAIServer, **options) -> OpenAITranscriber:
    limits = StreamLimits(connect_seconds=1, first_token_seconds=options.pop("answer_seconds", 5))
    return OpenAITranscriber(base_url=server.base_url, model="whisper-1", time_limits=limits, max_retries=0,
                             **options)


async def test_the_server_gets_the_recording_as_16_khz_wav_with_the_model_and_its_transcript_is_returned(server):
    server.add_transcription(QUESTION_EN)
    transcriber = server_transcriber(server, language="en")
    transcript = await transcriber.transcribe(recording("question_en.ogg"))
    await transcriber.close()
    assert transcript.text == QUESTION_EN and abs(transcript.audio_seconds - EN_SECONDS) < 0.03
    (upload,) = server.transcriptions
    assert upload.fields == {"model": "whisper-1", "response_format": "json", "language": "en"}
    assert (upload.file_name, upload.content_type) == ("voice.wav", "audio/wav")
    with wave.open(io.BytesIO(upload.file)) as file:
        assert (file.getnchannels(), file.getframerate()) == (1, SAMPLE_RATE)


@pytest.mark.parametrize("reply, raised, says", [
    pytest.param(HANG, SpeechTimeout, "sent no transcript within 0.3 s (OPENAI_FIRST_TOKEN_SECONDS)", id="time-out"),
    pytest.param(error(500, "CUDA out of memory"), SpeechUnavailable, "answered 500: CUDA out of memory",
                 id="server-error"),
])
async def test_a_server_that_fails_or_hangs_is_one_line(server, reply, raised, says):
    server.add_transcription(reply)
    transcriber = server_transcriber(server, answer_seconds=0.3)
    try:
        with pytest.raises(raised) as failed:
            await transcriber.transcribe(recording("question_en.ogg"))
    finally:
        await transcriber.close()
    assert says in str(failed.value) and "\n" not in str(failed.value)


async def test_nothing_is_sent_for_a_file_that_is_not_audio_or_is_too_long(server):
    transcriber = OpenAITranscriber(base_url=server.base_url, model="whisper-1", limits=SpeechLimits(max_seconds=2))
    try:
        with pytest.raises(NotAudio):
            await transcriber.transcribe(b"not audio")
        with pytest.raises(AudioTooLong):
            await transcriber.transcribe(recording("question_en.ogg"))
    finally:
        await transcriber.close()
    assert server.transcriptions == []


async def test_a_server_that_is_not_running_is_one_line():
    transcriber = OpenAITranscriber(base_url="http://127.0.0.1:9/v1", model="whisper-1", max_retries=0)
    try:
        with pytest.raises(SpeechUnavailable, match="cannot reach the transcription server"):
            await transcriber.transcribe(recording("question_en.ogg"))
    finally:
        await transcriber.close()


# --- qwenbot transcribe ----------------------------------------------------------------------------------------------

def qwenbot(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bot.program.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "LOG_LEVEL": "WARNING", **env})


def test_qwenbot_transcribe_prints_what_the_server_heard(server, tmp_path):
    server.add_transcription(QUESTION_EN)
    done = qwenbot("transcribe", str(ROOT / "tests/data/question_en.ogg"),
                   env={"DATA_DIR": str(tmp_path), "ASR_BACKEND": "openai", "ASR_MODEL": "whisper-1",
                        "ASR_BASE_URL": server.base_url})
    assert (done.returncode, done.stdout) == (0, QUESTION_EN + "\n")
    assert "2.9 s of audio" in done.stderr


@pytest.mark.parametrize("backend", ["local", "openai"])
def test_qwenbot_transcribe_of_a_file_that_is_not_audio_is_one_line_and_exit_2(backend, tmp_path):
    done = qwenbot("transcribe", "README.md", env={"DATA_DIR": str(tmp_path), "ASR_BACKEND": backend,
                                                   "ASR_BASE_URL": "http://127.0.0.1:9/v1"})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == "qwenbot: README.md: not a recording the decoder can read (Invalid data found " \
                                  "when processing input)"


def test_qwenbot_transcribe_with_speech_off_says_so(tmp_path):
    done = qwenbot("transcribe", "README.md", env={"DATA_DIR": str(tmp_path), "ASR_BACKEND": "off"})
    assert (done.returncode, done.stderr.strip()) == (2, "qwenbot: speech is off (ASR_BACKEND=off)")


@real_asr_test
def test_qwenbot_transcribe_with_the_local_model_prints_the_words(tmp_path):
    done = qwenbot("transcribe", "tests/data/question_en.ogg",
                   env={"DATA_DIR": str(tmp_path), "ASR_BACKEND": "local", "ASR_MODEL": str(whisper_folder())})
    assert (done.returncode, done.stdout.strip()) == (0, QUESTION_EN)
    assert done.stderr.strip().endswith("(en, 2.9 s of audio)")
