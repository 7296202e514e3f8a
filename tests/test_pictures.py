"""Questions about a picture, on the fake Bot API server: a photo (or image file) with a caption, or a question in
reply to one, reaches a model that sees as an image part of the question's message (the fake OpenAI server shows
what it got); a model that reads text only is never sent one, and the user is told so in one line."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from agent.errors import NotAnImage
from agent.images import fit_picture
from agent.llm.openai import OpenAILLM
from agent.llm.openai_stream import StreamLimits
from agent.memory import PICTURE_NOTE
from bot.telegram.i18n import text
from tests.fakes.openai_server import FakeOpenAIServer, error
from tests.fakes.telegram_bot import (ADMIN, ALICE, CAROL, QWEN_FINAL, QWEN_LOOKUP, TEAM, final, private_chat,
                                      start_bot, telegram_server)

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

QUESTION = "How many lessons does the course on this slide have?"


def picture_bytes(width: int = 3000, height: int = 2000, kind: str = "JPEG", mode: str = "RGB",
                  color: object = "navy") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (width, height), color).save(buffer, kind)
    return buffer.getvalue()


@pytest.fixture
def model_server():
    """A fake OpenAI-compatible model server."""
    with FakeOpenAIServer() as fake:
        yield fake


def seeing_model(server: FakeOpenAIServer, vision: str = "on") -> OpenAILLM:
    return OpenAILLM(base_url=server.base_url, model="fake-qwen", vision=vision, max_retries=0,
                     limits=StreamLimits(connect_seconds=2, first_token_seconds=10, silence_seconds=10))


def user_parts(request) -> list[dict]:
    """The content parts of the last user message of a chat request the server received."""
    user = [message for message in request.body["messages"] if message["role"] == "user"][-1]
    assert isinstance(user["content"], list), user["content"]
    return user["content"]


def sent_picture(part: dict) -> Image.Image:
    """The picture an image part carries (a data URL)."""
    url = part["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


# --- to a model that sees --------------------------------------------------------------------------------------------

async def test_a_photo_with_a_question_reaches_the_model_as_an_image_part_shrunk_to_its_limit(
        start_bot, telegram_server, model_server):
    model_server.add(final("It has 230 lessons."))
    bot = await start_bot(llm=seeing_model(model_server))
    chat = private_chat(ADMIN)
    photo_id = telegram_server.send_photo(chat, ADMIN, picture_bytes(), 3000, 2000, caption=QUESTION)

    assert await bot.answers(ADMIN.id, 1) == ["It has 230 lessons."]
    assert telegram_server.sent(ADMIN.id)[0].params["reply_parameters"]["message_id"] == photo_id
    (request,) = model_server.chat_requests
    image, question = user_parts(request)
    assert image["type"] == "image_url" and sent_picture(image).size == (1024, 683)  # IMAGE_MAX_SIDE
    assert question["type"] == "text" and question["text"].endswith(QUESTION)
    # The thumbnail (300 px) is too small for 1024: the original was fetched, and only it.
    assert telegram_server.files_fetched == ["photos/file_2.jpg"]
    assert await bot.query("SELECT question, input_kind FROM turns") == [(QUESTION, "photo")]
    assert await bot.query("SELECT content FROM messages WHERE role = 'user'") == [(PICTURE_NOTE + QUESTION,)]
    assert f"🖼 {QUESTION}" in await bot.ask(chat, ADMIN, "/trace")


async def test_a_question_in_reply_to_a_photo_carries_it_through_every_step_of_the_trace(
        start_bot, telegram_server, model_server):
    model_server.add(QWEN_LOOKUP, QWEN_FINAL)
    bot = await start_bot(llm=seeing_model(model_server), image_max_side=256)
    chat = private_chat(ALICE)
    photo_id = telegram_server.send_photo(chat, ALICE, picture_bytes(), 3000, 2000)
    assert await bot.answers(ALICE.id, 1) == [text("picture_needs_question", "zh")]  # no caption: how to ask
    telegram_server.send_text(chat, ALICE, "这门课一共多少节？", reply_to=photo_id)

    answers = await bot.answers(ALICE.id, 2)
    assert "200" in answers[1]
    first, second = model_server.chat_requests
    assert sent_picture(user_parts(first)[0]).size == (256, 171)
    # The ReAct trace is continued in the question's message, after its text: the picture stays before it.
    image, question = user_parts(second)
    assert image == user_parts(first)[0]
    assert question["text"].startswith(user_parts(first)[1]["text"]) and "Observation:" in question["text"]
    assert telegram_server.files_fetched == ["photos/file_1.jpg"]  # the thumbnail (300 px) is enough for 256


async def test_an_image_sent_as_a_file_is_a_picture_too(start_bot, telegram_server, model_server):
    model_server.add(final("A red square."))
    bot = await start_bot(llm=seeing_model(model_server))
    telegram_server.send_document(private_chat(ADMIN), ADMIN, "square.png",
                                  picture_bytes(64, 64, "PNG", "RGBA", (255, 0, 0, 0)), mime_type="image/png",
                                  caption="What is this?")
    assert await bot.answers(ADMIN.id, 1) == ["A red square."]
    picture = sent_picture(user_parts(model_server.chat_requests[0])[0])
    assert picture.size == (64, 64) and picture.getpixel((32, 32)) == (255, 255, 255)  # transparent: on white


async def test_in_a_group_a_photo_is_a_question_only_when_its_caption_mentions_the_bot(
        start_bot, telegram_server, model_server):
    model_server.add(final("A slide."))
    bot = await start_bot(llm=seeing_model(model_server))
    telegram_server.send_photo(TEAM, CAROL, picture_bytes(), 3000, 2000, caption="look at this")
    telegram_server.send_photo(TEAM, CAROL, picture_bytes(), 3000, 2000, caption="@qwen_test_bot what is this?")
    assert await bot.answers(TEAM.id, 1) == ["A slide."]
    assert telegram_server.files_fetched == ["photos/file_4.jpg"]
    assert user_parts(model_server.chat_requests[0])[1]["text"].endswith("Carol: what is this?")


async def test_the_pictures_of_an_album_without_a_caption_get_no_reply(start_bot, telegram_server, model_server):
    bot = await start_bot(llm=seeing_model(model_server))
    for _ in range(3):
        telegram_server.send_photo(private_chat(ADMIN), ADMIN, picture_bytes(), 3000, 2000, media_group_id="album-1")
    await telegram_server.settle()
    await bot.turns_done()
    assert telegram_server.sent_texts(ADMIN.id) == [] and model_server.chat_requests == []


async def test_a_file_that_says_it_is_an_image_but_is_not_is_one_line(start_bot, telegram_server, model_server):
    bot = await start_bot(llm=seeing_model(model_server))
    telegram_server.send_document(private_chat(ALICE), ALICE, "x.png", b"\x89PNG but not really", mime_type="image/png",
                                  caption="这是什么？")
    assert await bot.answers(ALICE.id, 1) == [text("not_a_picture", "zh")]
    assert model_server.chat_requests == []


async def test_a_picture_over_the_size_limit_is_one_line_and_never_fetched(start_bot, telegram_server, model_server):
    bot = await start_bot(llm=seeing_model(model_server), image_max_file_mb=1)
    telegram_server.send_document(private_chat(ADMIN), ADMIN, "big.jpg", picture_bytes(16, 16), mime_type="image/jpeg",
                                  caption="What is this?", file_size=3 * 1024 * 1024)
    assert await bot.answers(ADMIN.id, 1) == [text("picture_too_big", "en", size=3.0, limit=1.0)]
    assert telegram_server.calls_to("getFile") == []


# --- to a model that reads text only ---------------------------------------------------------------------------------

async def test_a_text_only_model_gets_nothing_and_the_user_one_line_in_their_language(
        start_bot, telegram_server, model_server):
    bot = await start_bot(llm=seeing_model(model_server, vision="off"))
    telegram_server.send_photo(private_chat(ALICE), ALICE, picture_bytes(), 3000, 2000, caption="这是什么课？")
    telegram_server.send_photo(private_chat(ADMIN), ADMIN, picture_bytes(), 3000, 2000)
    assert await bot.answers(ALICE.id, 1) == ["这个模型只能读文字，看不到图片。请用文字描述图片内容后再问。"]
    assert await bot.answers(ADMIN.id, 1) == [text("text_only_model", "en")]
    assert model_server.chat_requests == [] and telegram_server.calls_to("getFile") == []
    assert await bot.query("SELECT count(*) FROM turns") == [(0,)]


async def test_with_vision_auto_a_refused_picture_tells_the_user_and_no_picture_is_sent_again(
        start_bot, telegram_server, model_server):
    model_server.add(error(400, "At most 0 image(s) may be provided in one request."))
    bot = await start_bot(llm=seeing_model(model_server, vision="auto"))
    chat = private_chat(ALICE)
    telegram_server.send_photo(chat, ALICE, picture_bytes(), 3000, 2000, caption="这是什么课？")
    assert await bot.answers(ALICE.id, 1) == [text("text_only_model", "zh")]
    telegram_server.send_photo(chat, ALICE, picture_bytes(), 3000, 2000, caption="那这张呢？")
    assert (await bot.answers(ALICE.id, 2))[1] == text("text_only_model", "zh")
    assert len(model_server.chat_requests) == 1  # the second picture was never sent
    assert await bot.query("SELECT count(*) FROM messages") == [(0,)]  # nothing of either reached the history


# --- shrinking ---------------------------------------------------------------------------------------------------------

def test_a_picture_is_turned_upright_and_never_enlarged():
    image = Image.new("RGB", (200, 100), "green")
    exif = image.getexif()
    exif[0x0112] = 6  # orientation: rotate 90° clockwise to show
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", exif=exif)
    picture = fit_picture(buffer.getvalue(), max_side=1024)
    assert (picture.width, picture.height) == (100, 200)
    assert Image.open(io.BytesIO(picture.jpeg)).size == (100, 200)


def test_a_decompression_bomb_is_refused_from_its_header():
    buffer = io.BytesIO()
    Image.new("1", (10_000, 10_000)).save(buffer, "PNG")  # 100 megapixels in a few kilobytes
    with pytest.raises(NotAnImage, match="far too large"):
        fit_picture(buffer.getvalue(), max_side=1024)
