"""Settings: defaults, parsing, refusals that name the variable, and `.env.example` kept in step."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from bot.program.config import ConfigError, Settings

ROOT = Path(__file__).resolve().parent.parent
ENV_EXAMPLE = ROOT / ".env.example"


def example_values() -> dict[str, str]:
    """The `NAME=value` lines of `.env.example` (comments skipped)."""
    pairs = re.findall(r"^([A-Z][A-Z0-9_]*)=(.*)$", ENV_EXAMPLE.read_text(encoding="utf-8"), re.MULTILINE)
    return dict(pairs)


def test_empty_environment_gives_the_documented_defaults():
    settings = Settings.from_env({})
    assert settings == Settings()
    assert settings.storage.data_dir == ROOT / "data"  # a checkout keeps its data beside the code
    assert settings.storage.database_path == ROOT / "data" / "bot.sqlite3"
    assert settings.model.tokenizer_vocab_path == ROOT / "data" / "qwen.tiktoken"
    assert settings.model.model_cache_dir == ROOT / "data" / "models"
    assert settings.model.llm_backend == "local"
    assert settings.model.model == "Qwen/Qwen2.5-1.5B-Instruct"
    assert settings.agent.agent_mode == "react"
    assert settings.telegram.telegram_base_url == "https://api.telegram.org/bot"
    assert settings.access.admin_user_ids == frozenset()
    assert settings.agent.max_steps > 0 and settings.tools.tool_timeout_seconds > 0


def test_values_are_parsed_to_their_types():
    settings = Settings.from_env({
        "MAX_STEPS": "8", "TOOL_TIMEOUT_SECONDS": "2.5", "DATABASE_PATH": "/srv/bot/db.sqlite3",
        "LLM_BACKEND": "openai", "AGENT_MODE": "native", "MODEL": "models/qwen.gguf", "BATCH_SIZE": " 4 ",
        "LOG_LEVEL": "debug",
    })
    assert settings.agent.max_steps == 8
    assert settings.tools.tool_timeout_seconds == 2.5
    assert settings.storage.database_path == Path("/srv/bot/db.sqlite3")
    assert (settings.model.llm_backend, settings.agent.agent_mode, settings.model.model) == \
        ("openai", "native", "models/qwen.gguf")
    assert settings.engine.batch_size == 4
    assert settings.logging.log_level == "debug"


@pytest.mark.parametrize("raw, expected", [
    ("1, 2,3", {1, 2, 3}),
    ("1001234567890", {1001234567890}),
    ("7;8", {7, 8}),
    ("5,6,", {5, 6}),
    ("42", {42}),
])
def test_id_lists_are_parsed(raw, expected):
    # Users are positive, groups negative (tests/test_holes_settings.py has the refusals).
    chats = ",".join(f"-{part.strip()}" if part.strip() else "" for part in raw.replace(";", ",").split(","))
    settings = Settings.from_env({"ADMIN_USER_IDS": raw, "ALLOWED_USER_IDS": raw, "ALLOWED_CHAT_IDS": chats})
    assert settings.access.admin_user_ids == settings.access.allowed_user_ids == frozenset(expected)
    assert settings.access.allowed_chat_ids == frozenset(-i for i in expected)


def test_empty_or_blank_values_mean_the_default():
    settings = Settings.from_env({"MAX_STEPS": "", "LLM_BACKEND": "   ", "ADMIN_USER_IDS": ""})
    assert settings == Settings()


@pytest.mark.parametrize("variable, raw, says", [
    ("MAX_STEPS", "abc", "a whole number"),
    ("MAX_NEW_TOKENS", "1.5", "a whole number"),
    ("TOOL_TIMEOUT_SECONDS", "soon", "a number"),
    ("LLM_BACKEND", "foo", "local, openai"),
    ("AGENT_MODE", "chain", "react, native"),
    ("MAX_STEPS", "0", "greater than 0"),
    ("MAX_STEPS", "-1", "greater than 0"),
    ("BATCH_SIZE", "-4", "greater than 0"),
    ("HISTORY_TOKEN_BUDGET", "0", "greater than 0"),
    ("TOOL_TIMEOUT_SECONDS", "0", "greater than 0"),
    ("TOOL_TIMEOUT_SECONDS", "nan", "greater than 0"),
    ("TURN_TIMEOUT_SECONDS", "-5", "greater than 0"),
    ("TYPING_INTERVAL_SECONDS", "0", "greater than 0"),
    ("OPENAI_MAX_RETRIES", "-1", "0 or more"),
    ("KERNEL_CACHE_ENTRIES", "-1", "0 or more"),
    ("MODEL_INT8_KEPT", "-1", "0 or more"),
    ("OPENAI_SILENCE_SECONDS", "0", "greater than 0"),
    ("OPENAI_FIRST_TOKEN_SECONDS", "-1", "greater than 0"),
    ("STREAM_INTERVAL_SECONDS", "0", "greater than 0"),
    ("SCRIPTED_TOKEN_SECONDS", "-0.1", "0 or more"),
    ("MCP_CONNECT_TIMEOUT_SECONDS", "0", "greater than 0"),
    ("MCP_RETRY_SECONDS", "-1", "0 or more"),
    ("MCP_MAX_TOOLS_PER_SERVER", "0", "greater than 0"),
    ("WEBHOOK_PORT", "70000", "65535"),
    ("LOG_LEVEL", "loud", "DEBUG, INFO"),
    ("ADMIN_USER_IDS", "1,x", "list of numeric ids"),
    ("ALLOWED_USER_IDS", "@alice", "list of numeric ids"),
    ("ALLOWED_CHAT_IDS", "-100, group", "list of numeric ids"),
])
def test_bad_values_are_refused_with_one_line_naming_the_variable(variable, raw, says):
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({variable: raw})
    message = str(caught.value)
    assert message.startswith(f"{variable} must be"), message
    assert says in message
    assert "\n" not in message


def test_a_retired_setting_still_set_is_refused_with_what_replaced_it():
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"OPENAI_TIMEOUT_SECONDS": "60"})
    message = str(caught.value)
    assert message.startswith("OPENAI_TIMEOUT_SECONDS is no longer read: ")
    assert "OPENAI_FIRST_TOKEN_SECONDS" in message and "OPENAI_SILENCE_SECONDS" in message


def test_the_bad_value_is_quoted_in_the_message():
    with pytest.raises(ConfigError, match=r"^MAX_STEPS must be a whole number, got 'abc'$"):
        Settings.from_env({"MAX_STEPS": "abc"})
    with pytest.raises(ConfigError, match=r"^LLM_BACKEND must be one of .*, got 'foo'$"):
        Settings.from_env({"LLM_BACKEND": "foo"})


def test_process_environment_is_read_when_no_mapping_is_given(monkeypatch):
    monkeypatch.setenv("MAX_STEPS", "11")
    monkeypatch.setenv("ADMIN_USER_IDS", "3,4")
    settings = Settings.from_env(dotenv=False)
    assert settings.agent.max_steps == 11
    assert settings.access.admin_user_ids == frozenset({3, 4})


def test_require_telegram_token():
    with pytest.raises(ConfigError, match=r"^TELEGRAM_BOT_TOKEN is not set"):
        Settings.from_env({}).require_telegram_token()
    Settings.from_env({"TELEGRAM_BOT_TOKEN": "123:abc"}).require_telegram_token()


def test_settings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().agent.max_steps = 100  # type: ignore[misc]


def test_every_setting_has_a_line_in_env_example_and_every_line_a_setting():
    documented = set(example_values())
    fields = set(Settings.variables())
    assert fields - documented == set(), "settings missing from .env.example"
    assert documented - fields == set(), ".env.example lines that are no setting"


def test_env_example_shows_the_defaults():
    assert Settings.from_env(example_values()) == Settings()


def test_relative_paths_are_taken_inside_the_data_dir_and_absolute_ones_kept(tmp_path):
    settings = Settings.from_env({"DATA_DIR": str(tmp_path), "DATABASE_PATH": "db/main.sqlite3",
                                  "TOKENIZER_VOCAB_PATH": "/opt/vocab/qwen.tiktoken", "MODEL_CACHE_DIR": "hub"})
    assert settings.storage.database_path == tmp_path / "db" / "main.sqlite3"
    assert settings.model.tokenizer_vocab_path == Path("/opt/vocab/qwen.tiktoken")
    assert settings.model.model_cache_dir == tmp_path / "hub"


def test_a_data_dir_in_the_home_folder_is_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert Settings.from_env({"DATA_DIR": "~/bot"}).storage.database_path == tmp_path / "bot" / "bot.sqlite3"


def test_a_relative_data_dir_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^DATA_DIR must be an absolute path, got 'mydata'$"):
        Settings.from_env({"DATA_DIR": "mydata"})


def test_an_old_env_database_path_that_would_hide_the_database_is_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "bot.sqlite3").write_bytes(b"")  # the database the old relative setting meant
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"DATA_DIR": str(data), "DATABASE_PATH": "data/bot.sqlite3"})
    assert str(caught.value).endswith(f"no longer names your database {data / 'bot.sqlite3'}: "
                                      "set DATABASE_PATH=bot.sqlite3")
    assert Settings.from_env({"DATA_DIR": str(data)}).storage.database_path == data / "bot.sqlite3"


def test_the_dotenv_file_is_the_projects_whatever_the_current_folder(monkeypatch, tmp_path):
    from bot.program.paths import dotenv_file

    monkeypatch.chdir(tmp_path)
    assert dotenv_file() == ROOT / ".env"


def test_env_example_has_one_section_per_group_holding_exactly_its_variables():
    sections: dict[str, list[str]] = {}
    current = None
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        if (header := re.match(r"^# --- (\w+): ", line)) is not None:
            current = sections.setdefault(header.group(1), [])
        elif (variable := re.match(r"^([A-Z][A-Z0-9_]*)=", line)) is not None:
            current.append(variable.group(1))
    groups = {spec.name: [name.upper() for name in vars(getattr(Settings(), spec.name))]
              for spec in dataclasses.fields(Settings)}
    assert sections == groups


def test_flat_keywords_build_and_change_settings_group_by_group(tmp_path):
    settings = Settings.of(data_dir=tmp_path, max_steps=3, webhook_port=9000)
    assert (settings.agent.max_steps, settings.webhook.webhook_port) == (3, 9000)
    assert settings.storage.database_path == tmp_path / "bot.sqlite3"
    changed = settings.replaced(max_steps=4)
    assert (changed.agent.max_steps, changed.webhook.webhook_port, settings.agent.max_steps) == (4, 9000, 3)
    assert Settings.of() == Settings()
    with pytest.raises(TypeError, match="no such setting: max_stepz"):
        Settings.of(max_stepz=3)
