"""Questions asked by voice, on the fake Bot API server: the recording is fetched as a real bot fetches it (getFile,
then /file/bot<token>/<path>), transcribed, shown, and answered like a typed question; every way it can fail is one
line. The whole path runs once with the real whisper-base weights; the rest transcribe on a fake OpenAI-compatible
/audio/transcriptions server, which is quick and can be made to fail."""

from __future__ import annotations

import pytest

from bot.telegram.i18n import text
from tests.fakes.openai_server import HANG, FakeOpenAIServer, error
from tests.fakes.telegram_bot import (ADMIN, ALICE, BOB, CAROL, TEAM, final, lookup, private_chat, start_bot,
                                      telegram_server)
from tests.real_speech import QUESTION_EN, real_asr_test, recording, whisper_folder

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

ANSWER = "The machine learning course has 230 lessons."
# A strong model's turn: the lookup that grounds the answer's 230, then the answer.
LOOKED_UP = (lookup("机器学习实战"), final(ANSWER))


@pytest.fixture
def speech_server():
    """A fake transcription server."""
    with FakeOpenAIServer() as fake:
        yield fake


def on_server(server: FakeOpenAIServer, **overrides) -> dict:
    """Settings that transcribe on `server`."""
    return {"asr_backend": "openai", "asr_base_url": server.base_url, "asr_model": "whisper-1",
            "openai_max_retries": 0, **overrides}


async def nothing_stored(bot) -> bool:
    return await bot.query("SELECT count(*) FROM turns") == [(0,)] and \
        await bot.query("SELECT count(*) FROM messages") == [(0,)]


# --- the whole path, for real ---------------------------------------------------------------------------------------

@real_asr_test
async def test_a_voice_question_is_fetched_transcribed_shown_first_and_answered(start_bot, telegram_server):
    bot = await start_bot([*LOOKED_UP], delay=1.0, asr_backend="local", asr_model=str(whisper_folder()))
    chat = private_chat(ALICE)
    voice_id = telegram_server.send_voice(chat, ALICE, recording("question_en.ogg"), duration=3)

    (answer,) = await bot.answers(ALICE.id, 1, timeout=120)
    shown = f"🎤 {QUESTION_EN}"
    assert answer == f"{shown}\n\n{ANSWER}"  # in a private chat, the transcript starts the answer
    assert telegram_server.draft_texts(ALICE.id)[0] == shown  # shown while the model was still at work
    assert telegram_server.sent(ALICE.id)[0].params["reply_parameters"]["message_id"] == voice_id
    assert [call.params["file_id"] for call in telegram_server.calls_to("getFile")] == ["file-1"]
    assert telegram_server.files_fetched == ["voice/file_1.oga"]
    assert QUESTION_EN in bot.llm.requests[0].last_content  # asked as if typed
    assert await bot.query("SELECT question, input_kind, status FROM turns") == [(QUESTION_EN, "voice", "answered")]
    assert await bot.query("SELECT role, content FROM messages ORDER BY id") == [("user", QUESTION_EN),
                                                                                ("assistant", ANSWER)]
    trace = await bot.ask(chat, ALICE, "/trace")
    assert shown in trace


# --- on a transcription server ----------------------------------------------------------------------------------------

async def test_in_a_group_the_transcript_is_a_reply_to_the_recording_then_the_answer(start_bot, telegram_server,
                                                                                     speech_server):
    speech_server.add_transcription(QUESTION_EN)
    bot = await start_bot([final("Hello, team."), *LOOKED_UP], **on_server(speech_server))
    await bot.ask(TEAM, CAROL, "@qwen_test_bot hello")
    bots_message = telegram_server.sent(TEAM.id)[0].result["message_id"]
    voice_id = telegram_server.send_voice(TEAM, CAROL, recording("question_en.ogg"), duration=3, reply_to=bots_message)

    texts = await bot.answers(TEAM.id, 3)
    assert texts[1:] == [f"🎤 {QUESTION_EN}", ANSWER]
    assert [call.params["reply_parameters"]["message_id"] for call in telegram_server.sent(TEAM.id)[1:]] == \
        [voice_id, voice_id]
    assert bot.llm.requests[1].last_content.endswith(f"Carol: {QUESTION_EN}")


async def test_group_voice_notes_not_meant_for_the_bot_are_never_fetched(start_bot, telegram_server, speech_server):
    bot = await start_bot(**on_server(speech_server))
    telegram_server.send_voice(TEAM, CAROL, recording("question_en.ogg"), duration=3)
    telegram_server.send_voice(TEAM, CAROL, recording("question_en.ogg"), duration=3, caption="@qwen_test_bot")
    speech_server.add_transcription(QUESTION_EN)
    bot.llm.add(*LOOKED_UP)
    texts = await bot.answers(TEAM.id, 2)
    assert texts == [f"🎤 {QUESTION_EN}", ANSWER]  # only the one whose caption mentions the bot
    assert telegram_server.files_fetched == ["voice/file_2.oga"]


@pytest.mark.parametrize("kind", ["audio", "video_note"])
async def test_audio_files_and_video_notes_are_questions_too(start_bot, telegram_server, speech_server, kind):
    speech_server.add_transcription(QUESTION_EN)
    bot = await start_bot([*LOOKED_UP], **on_server(speech_server))
    telegram_server.send_voice(private_chat(ADMIN), ADMIN, recording("question_en.ogg"), duration=3, kind=kind)
    assert await bot.answers(ADMIN.id, 1) == [f"🎤 {QUESTION_EN}\n\n{ANSWER}"]


async def test_a_caption_goes_with_the_transcript(start_bot, telegram_server, speech_server):
    speech_server.add_transcription(QUESTION_EN)
    bot = await start_bot([*LOOKED_UP], **on_server(speech_server))
    telegram_server.send_voice(private_chat(ADMIN), ADMIN, recording("question_en.ogg"), duration=3,
                               caption="Answer in one line.")
    await bot.answers(ADMIN.id, 1)
    assert bot.llm.requests[0].last_content.endswith(f"Answer in one line.\n{QUESTION_EN}")


@pytest.mark.parametrize("reply, key", [
    pytest.param(HANG, "voice_timeout", id="server-times-out"),
    pytest.param(error(500, "CUDA out of memory"), "voice_failed", id="server-error"),
    pytest.param("", "voice_unheard", id="nothing-heard"),
])
async def test_a_transcription_that_fails_is_one_line_and_asks_nothing(start_bot, telegram_server, speech_server,
                                                                       reply, key):
    speech_server.add_transcription(reply)
    bot = await start_bot(**on_server(speech_server, openai_first_token_seconds=0.5))
    telegram_server.send_voice(private_chat(ALICE), ALICE, recording("question_en.ogg"), duration=3)
    assert await bot.answers(ALICE.id, 1) == [text(key, "zh")]
    await bot.turns_done()
    assert telegram_server.sent_texts(ALICE.id) == [text(key, "zh")]
    assert bot.llm.requests == [] and await nothing_stored(bot)


@pytest.mark.parametrize("duration, size, reply", [
    pytest.param(121, None, text("voice_too_long", "zh", limit="120"), id="declared-too-long"),
    pytest.param(30, 21 * 1024 * 1024, text("voice_too_big", "zh", size=21.0, limit=20.0), id="declared-too-big"),
])
async def test_a_recording_over_the_limits_is_one_line_and_never_fetched(start_bot, telegram_server, speech_server,
                                                                         duration, size, reply):
    bot = await start_bot(**on_server(speech_server))
    telegram_server.send_voice(private_chat(ALICE), ALICE, b"OggS...", duration=duration, size=size)
    assert await bot.answers(ALICE.id, 1) == [reply]
    assert telegram_server.calls_to("getFile") == [] and speech_server.transcriptions == []
    assert bot.llm.requests == [] and await nothing_stored(bot)


async def test_a_recording_longer_than_declared_is_refused_once_decoded(start_bot, telegram_server, speech_server):
    bot = await start_bot(**on_server(speech_server, asr_max_seconds=2))
    telegram_server.send_voice(private_chat(ALICE), ALICE, recording("question_en.ogg"), duration=1)
    assert await bot.answers(ALICE.id, 1) == [text("voice_too_long", "zh", limit="2")]
    assert speech_server.transcriptions == [] and bot.llm.requests == []


async def test_a_voice_file_that_is_not_audio_is_one_line(start_bot, telegram_server, speech_server):
    bot = await start_bot(**on_server(speech_server))
    telegram_server.send_voice(private_chat(ALICE), ALICE, b"<html>not a recording</html>", duration=3)
    assert await bot.answers(ALICE.id, 1) == [text("not_audio", "zh")]
    assert speech_server.transcriptions == [] and bot.llm.requests == []


async def test_a_strangers_voice_note_is_refused_and_never_fetched(start_bot, telegram_server, speech_server):
    bot = await start_bot(**on_server(speech_server))
    telegram_server.send_voice(private_chat(BOB), BOB, recording("question_en.ogg"), duration=3)
    (reply,) = await bot.answers(BOB.id, 1)
    assert str(BOB.id) in reply and "/allow" in reply
    await bot.turns_done()
    assert telegram_server.calls_to("getFile") == [] and speech_server.transcriptions == []


async def test_with_speech_off_a_voice_note_gets_the_text_only_reply(start_bot, telegram_server):
    bot = await start_bot(asr_backend="off")
    telegram_server.send_voice(private_chat(ALICE), ALICE, recording("question_en.ogg"), duration=3)
    assert await bot.answers(ALICE.id, 1) == [text("text_only", "zh")]
    assert telegram_server.calls_to("getFile") == []


async def test_voice_questions_keep_their_place_in_line_behind_a_typed_one(start_bot, telegram_server, speech_server):
    speech_server.add_transcription(QUESTION_EN)
    bot = await start_bot([final("first"), final("second")], delay=0.5, **on_server(speech_server))
    chat = private_chat(ADMIN)
    telegram_server.send_text(chat, ADMIN, "a typed question")
    telegram_server.send_voice(chat, ADMIN, recording("question_en.ogg"), duration=3)
    await telegram_server.wait_for(lambda: any(t.endswith("second") for t in telegram_server.sent_texts(ADMIN.id)))
    texts = telegram_server.sent_texts(ADMIN.id)
    assert [t for t in texts if t != text("queued", "en")] == ["first", f"🎤 {QUESTION_EN}\n\nsecond"]
    assert [request.last_content.rsplit(": ", 1)[-1] for request in bot.llm.requests] == ["a typed question",
                                                                                         QUESTION_EN]
