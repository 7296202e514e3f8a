"""Settings and ids (issue 13): a bad value shaped like a bot token is never echoed; a DATABASE_PATH that cannot
be created is reported naming the variable; ADMIN_USER_IDS, ALLOWED_USER_IDS, ALLOWED_CHAT_IDS and /allow read
ids with one parser (no `1_001`, no fullwidth or Arabic-Indic digits, no negative user ids) and refuse Telegram's
service accounts, whose id stands for every anonymous admin or channel.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_asyncio

from bot.program.config import ConfigError, Settings
from tests.fakes.telegram_bot import ADMIN, ALICE, STRANGERS, final, private_chat, running_bot
from tests.fakes.telegram_server import FakeTelegramServer, User

module_loop = pytest.mark.asyncio(loop_scope="module")  # the async tests share the module's running bot

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "7212345678:AAHq3xZk9V_secret-part-of-the-token-x"  # a real token's shape: digits, colon, 35 characters
SECRET = TOKEN.split(":")[1]
SETTING_NAMES = Settings.variables()
ANONYMOUS_ADMIN = User(1087968824, "Group", username="GroupAnonymousBot", is_bot=True)


def qwenbot(*args: str, **env: str) -> subprocess.CompletedProcess:
    """`qwenbot ARGS` as a process, with `env` as its only settings."""
    clean = {k: v for k, v in os.environ.items() if k not in SETTING_NAMES}
    return subprocess.run([sys.executable, "-m", "bot.program.cli", *args], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=60)


# --- a token in the wrong variable ---------------------------------------------------------------------------------

@pytest.mark.parametrize("variable", SETTING_NAMES)
def test_a_token_in_any_variable_is_never_echoed_by_its_error(variable):
    try:
        Settings.from_env({variable: TOKEN})
    except ConfigError as error:
        message = str(error)
        assert message.startswith(variable) and "[REDACTED]" in message, message
        assert SECRET not in message and TOKEN.split(":")[0] not in message, message


def test_every_variable_that_refuses_a_token_was_checked_above():
    # The control for the test above: most variables do refuse such a value (numbers, choices, id lists).
    refused = []
    for variable in SETTING_NAMES:
        try:
            Settings.from_env({variable: TOKEN})
        except ConfigError:
            refused.append(variable)
    assert {"MAX_STEPS", "LLM_BACKEND", "ADMIN_USER_IDS", "WEBHOOK_PORT", "LOG_LEVEL"} <= set(refused)
    assert len(refused) >= 25


def test_qwenbot_says_which_variable_holds_a_bad_value_without_showing_the_token(tmp_path):
    result = qwenbot("migrate", MAX_STEPS=TOKEN, DATABASE_PATH=str(tmp_path / "bot.sqlite3"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["qwenbot: MAX_STEPS must be a whole number, got '[REDACTED]'"]
    assert SECRET not in result.stderr + result.stdout


def test_a_database_path_that_cannot_be_created_names_the_variable(tmp_path):
    result = qwenbot("migrate", DATABASE_PATH="/proc/x/y.db")
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("qwenbot: cannot open the database /proc/x/y.db: ") and "DATABASE_PATH" in line, line
    assert "Traceback" not in result.stderr


def test_qwenbot_run_names_the_variable_too(tmp_path):
    # `run` takes the instance lock beside the database first: the lock file's folder is what fails here.
    result = qwenbot("run", DATABASE_PATH="/proc/x/y.db", TELEGRAM_BOT_TOKEN="123:abc",
                     TELEGRAM_BASE_URL="http://127.0.0.1:9/bot")
    assert result.returncode == 2
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("qwenbot: cannot open the database /proc/x/y.db: ") and "DATABASE_PATH" in line, line
    assert "Traceback" not in result.stderr


def test_a_token_in_a_database_path_is_not_shown_either(tmp_path):
    result = qwenbot("migrate", DATABASE_PATH=f"/proc/{TOKEN}/y.db")
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert "DATABASE_PATH" in line and "[REDACTED]" in line and SECRET not in line, line


# --- one id parser -------------------------------------------------------------------------------------------------

NOT_IDS = ["1_001", "１２３", "١٢٣", "²", "+42", "0", "-0", "4 2", "0x2a", "42.0", "1e3", str(2 ** 53),
           "99999999999999999999", "abc", TOKEN]


@pytest.mark.parametrize("word", NOT_IDS)
@pytest.mark.parametrize("variable", ["ADMIN_USER_IDS", "ALLOWED_USER_IDS", "ALLOWED_CHAT_IDS"])
def test_id_settings_refuse_what_is_not_an_id(variable, word):
    raw = f"-{word}" if variable == "ALLOWED_CHAT_IDS" and word[0].isdigit() else word
    with pytest.raises(ConfigError, match=f"^{variable} must be a comma-separated list of numeric ids: "):
        Settings.from_env({variable: f"42, {raw}" if variable != "ALLOWED_CHAT_IDS" else f"-42, {raw}"})


@pytest.mark.parametrize("variable, raw, says", [
    ("ADMIN_USER_IDS", "-1001234567890", "-1001234567890 is a group id; a user id is positive"),
    ("ALLOWED_USER_IDS", "-5", "-5 is a group id"),
    ("ALLOWED_CHAT_IDS", "5", "5 is a user id; a group id is negative"),
    ("ADMIN_USER_IDS", "1087968824", "GroupAnonymousBot"),
    ("ALLOWED_USER_IDS", "136817688", "Channel_Bot"),
    ("ALLOWED_USER_IDS", "777000", "Telegram's service account"),
])
def test_id_settings_refuse_the_wrong_kind_of_id_and_service_accounts(variable, raw, says):
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({variable: raw})
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_good_id_lists_are_read():
    settings = Settings.from_env({"ADMIN_USER_IDS": "1, 2;3,", "ALLOWED_USER_IDS": "007",
                                  "ALLOWED_CHAT_IDS": "-1001234567890; -5"})
    assert settings.access.admin_user_ids == {1, 2, 3} and settings.access.allowed_user_ids == {7}
    assert settings.access.allowed_chat_ids == {-1001234567890, -5}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory):
    """One running bot for the /allow checks."""
    with FakeTelegramServer() as server:
        running = await running_bot(server, tmp_path_factory.mktemp("ids"), [final("hello")] * 5)
        yield running
        await running.stop()


async def allow(bot, word: str) -> str:
    """An admin sends /allow WORD; the bot's reply."""
    return await bot.ask(private_chat(ADMIN), ADMIN, f"/allow {word}")


@module_loop
@pytest.mark.parametrize("word", [w for w in NOT_IDS if " " not in w])
async def test_allow_refuses_the_same_words_as_the_settings(bot, word):
    reply = await allow(bot, word)
    assert reply.startswith("❌") and "Usage: /allow ID" in reply, reply
    assert SECRET not in reply
    assert await bot.query("SELECT * FROM access_list") == []


@module_loop
@pytest.mark.parametrize("word", ["1087968824", "136817688", "777000"])
async def test_allow_refuses_telegrams_service_accounts(bot, word):
    reply = await allow(bot, word)
    assert reply.startswith(f"❌ {word} is ") and "would let all of them in" in reply, reply
    assert await bot.query("SELECT * FROM access_list") == []


@module_loop
async def test_allow_takes_what_the_settings_take(bot):
    for word, kind in (("007", "user"), ("-1001234567890", "chat")):
        assert (await allow(bot, word)).startswith(f"✅ {kind} {int(word)} is allowed")
    assert await bot.query("SELECT kind, subject_id FROM access_list ORDER BY subject_id") == \
        [("chat", -1001234567890), ("user", 7)]


@module_loop
async def test_a_service_account_allowed_before_this_fix_still_lets_no_anonymous_sender_in(bot):
    # A row written by an older version: the anonymous admin of a group nobody allowed must still be refused.
    async with bot.db.transaction() as conn:
        await conn.execute("INSERT INTO access_list (kind, subject_id, allowed) VALUES ('user', ?, 1)",
                           (ANONYMOUS_ADMIN.id,))
    before = len(bot.llm.requests)
    bot.server.push_message(STRANGERS, ANONYMOUS_ADMIN, text="/ask what do you know?",
                            sender_chat=STRANGERS.as_dict())
    await bot.server.wait_for(lambda: bot.server.sent_texts(STRANGERS.id), 5, "the refusal")
    assert "/allow" in bot.server.sent_texts(STRANGERS.id)[0] and len(bot.llm.requests) == before
    # An allowed user is still answered: the refusal above is about the service account only.
    assert await bot.ask(private_chat(ALICE), ALICE, "hi") == "hello"
