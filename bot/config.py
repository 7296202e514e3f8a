"""Settings: every knob of the bot, read once from the environment (and `.env`).

Each field is mirrored, with its default and an explanation, in `.env.example`.
Tests build `Settings(...)` directly or call `Settings.from_env({...})` with an explicit mapping.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping

from dotenv import load_dotenv

from agent.grammar import GrammarLimits
from agent.llm.base import MODEL_DTYPES
from agent.llm.engine.speculative import SpeculativeLimits
from agent.loop import AgentLimits
from agent.prompts import REACT_LAYOUTS
from bot.ids import IdError, parse_chat_id, parse_user_id
from bot.logs import redact_token_shapes
from bot.paths import default_data_dir, dotenv_file, moved_database, under
from core.errors import BotError
from tools.mcp import McpLimits

LLM_BACKENDS = ("local", "openai", "scripted")
AGENT_MODES = ("react", "native")
OPENAI_GRAMMARS = ("off", "vllm", "sglang", "llama.cpp")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# Settings that no longer exist, and what replaced them: a .env that still sets one is told, not silently ignored.
RETIRED = {
    "OPENAI_TIMEOUT_SECONDS": "the openai backend now has OPENAI_CONNECT_TIMEOUT_SECONDS, OPENAI_FIRST_TOKEN_SECONDS "
                              "and OPENAI_SILENCE_SECONDS instead of one deadline per call",
}


class ConfigError(BotError, ValueError):
    """A setting has a value the bot cannot use; the message names the variable."""


@dataclass(frozen=True)
class Settings:
    """The bot's configuration. Field `foo_bar` is read from the variable `FOO_BAR`."""

    telegram_bot_token: str = ""
    telegram_base_url: str = "https://api.telegram.org/bot"
    webhook_url: str = ""
    webhook_listen: str = "127.0.0.1"
    webhook_port: int = 8443
    webhook_secret_token: str = ""
    webhook_max_body_bytes: int = 1_048_576
    telegram_messages_per_second: float = 30.0
    telegram_group_messages_per_minute: float = 20.0
    data_dir: Path = field(default_factory=default_data_dir)
    database_path: Path = Path("bot.sqlite3")
    database_busy_timeout_seconds: float = 10.0
    database_check_seconds: float = 2.0
    instance_lock_wait_seconds: float = 30.0
    llm_backend: str = "local"
    model: str = "Qwen/Qwen2.5-1.5B-Instruct"
    model_device_map: str = "auto"
    model_dtype: str = "auto"
    model_cache_dir: Path = Path("models")
    model_converted_dir: Path = Path("converted-models")
    prefix_cache_mb: int = 512
    speculative_tokens: int = SpeculativeLimits.per_row
    speculative_step_tokens: int = SpeculativeLimits.per_step
    openai_base_url: str = "http://127.0.0.1:8000/v1"
    openai_api_key: str = "EMPTY"
    openai_model: str = ""
    openai_connect_timeout_seconds: float = 10.0
    openai_first_token_seconds: float = 120.0
    openai_silence_seconds: float = 30.0
    openai_startup_seconds: float = 60.0
    openai_max_retries: int = 3
    openai_grammar: str = "off"
    agent_mode: str = AgentLimits.mode
    react_layout: str = AgentLimits.react_layout
    scripted_replies_path: str = ""
    scripted_delay_seconds: float = 0.0
    scripted_token_seconds: float = 0.0
    tokenizer_vocab_path: Path = Path("qwen.tiktoken")
    admin_user_ids: frozenset[int] = field(default_factory=frozenset)
    allowed_user_ids: frozenset[int] = field(default_factory=frozenset)
    allowed_chat_ids: frozenset[int] = field(default_factory=frozenset)
    refusal_interval_seconds: float = 3600.0
    max_steps: int = AgentLimits.max_steps
    max_new_tokens: int = AgentLimits.max_new_tokens
    constrained_decoding: bool = AgentLimits.grammar is not None
    thought_max_tokens: int = GrammarLimits.thought_max_tokens
    tool_string_max_chars: int = GrammarLimits.string_max_chars
    require_tool_call: bool = AgentLimits.require_tool_call
    course_names_free_text: bool = False
    tool_timeout_seconds: float = 10.0
    history_token_budget: int = AgentLimits.history_token_budget
    observation_max_chars: int = AgentLimits.observation_max_chars
    batch_size: int = 8
    batch_wait_ms: int = 20
    turn_timeout_seconds: float = AgentLimits.turn_timeout_seconds
    max_pending_questions: int = 10
    max_question_chars: int = 4096
    progress_after_seconds: float = 2.0
    typing_interval_seconds: float = 4.0
    stream_interval_seconds: float = 1.0
    group_stream_interval_seconds: float = 3.0
    shutdown_grace_seconds: float = 10.0
    send_patience_seconds: float = 30.0
    answer_resend_seconds: float = 60.0
    mcp_config_path: str = ""
    mcp_connect_timeout_seconds: float = McpLimits.connect_timeout_seconds
    mcp_retry_seconds: float = McpLimits.retry_seconds
    mcp_max_tools_per_server: int = McpLimits.max_tools_per_server
    mcp_description_max_chars: int = McpLimits.description_max_chars
    log_level: str = "INFO"
    doctor_min_free_disk_mb: int = 2000
    doctor_timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        """Make every path absolute against DATA_DIR, so no path depends on the folder `qwenbot` runs in."""
        data_dir = self.data_dir.expanduser()
        if not data_dir.is_absolute():
            raise ConfigError(f"DATA_DIR must be an absolute path, got {shown(str(self.data_dir))}")
        object.__setattr__(self, "data_dir", data_dir)
        if (old := moved_database(data_dir, self.database_path)) is not None:
            raise ConfigError(f"DATABASE_PATH is now relative to DATA_DIR ({data_dir}), so {self.database_path} "
                              f"no longer names your database {old}: set DATABASE_PATH={old.relative_to(data_dir)}")
        for name in ("database_path", "tokenizer_vocab_path", "model_cache_dir", "model_converted_dir"):
            object.__setattr__(self, name, under(data_dir, getattr(self, name)))
        if self.mcp_config_path:  # empty: no file
            object.__setattr__(self, "mcp_config_path", str(under(data_dir, Path(self.mcp_config_path))))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, dotenv: bool = True) -> "Settings":
        """Read settings from `environ` (default: the process environment, after loading `.env`)."""
        if environ is None:
            if dotenv:
                load_dotenv(dotenv_file())
            environ = os.environ
        _refuse_retired(environ)
        values: dict[str, Any] = {}
        for spec in fields(cls):
            raw = environ.get(spec.name.upper())
            if raw is not None and raw.strip() != "":
                values[spec.name] = _parse(spec.name, str(spec.type), raw.strip())
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Refuse values that parse but make no sense, naming the variable."""
        _one_of("LLM_BACKEND", self.llm_backend, LLM_BACKENDS)
        _one_of("AGENT_MODE", self.agent_mode, AGENT_MODES)
        _one_of("REACT_LAYOUT", self.react_layout, REACT_LAYOUTS)
        _one_of("MODEL_DTYPE", self.model_dtype, MODEL_DTYPES)
        _one_of("OPENAI_GRAMMAR", self.openai_grammar, OPENAI_GRAMMARS)
        # logging.basicConfig raises (a traceback) on an unknown level name, so refuse it here.
        _one_of("LOG_LEVEL", self.log_level.upper(), LOG_LEVELS)
        if self.webhook_port > 65535:
            raise ConfigError(f"WEBHOOK_PORT must be at most 65535, got {self.webhook_port}")
        for name in ("max_steps", "max_new_tokens", "history_token_budget", "batch_size",
                     "observation_max_chars", "webhook_port", "max_pending_questions", "max_question_chars",
                     "webhook_max_body_bytes", "mcp_max_tools_per_server",
                     "mcp_description_max_chars", "thought_max_tokens", "tool_string_max_chars"):
            _positive(name.upper(), getattr(self, name))
        for name in ("tool_timeout_seconds", "turn_timeout_seconds", "openai_connect_timeout_seconds",
                     "openai_first_token_seconds", "openai_silence_seconds", "openai_startup_seconds",
                     "typing_interval_seconds", "stream_interval_seconds", "group_stream_interval_seconds",
                     "doctor_timeout_seconds", "database_check_seconds", "send_patience_seconds",
                     "answer_resend_seconds", "mcp_connect_timeout_seconds"):
            _positive(name.upper(), getattr(self, name))
        for name in ("scripted_delay_seconds", "scripted_token_seconds", "refusal_interval_seconds",
                     "instance_lock_wait_seconds", "mcp_retry_seconds"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name.upper()} must be 0 or more, got {getattr(self, name)}")
        for name in ("prefix_cache_mb", "speculative_tokens", "speculative_step_tokens"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name.upper()} must be 0 or more, got {getattr(self, name)}")
        if self.batch_wait_ms < 0:
            raise ConfigError(f"BATCH_WAIT_MS must be 0 or more, got {self.batch_wait_ms}")
        if self.doctor_min_free_disk_mb < 0:
            raise ConfigError(f"DOCTOR_MIN_FREE_DISK_MB must be 0 or more, got {self.doctor_min_free_disk_mb}")
        if self.openai_max_retries < 0:
            raise ConfigError("OPENAI_MAX_RETRIES must be 0 or more, got %d" % self.openai_max_retries)

    def require_telegram_token(self) -> None:
        """`qwenbot run` cannot start without a token; say so in one line."""
        if not self.telegram_bot_token:
            raise ConfigError("TELEGRAM_BOT_TOKEN is not set: create a bot with @BotFather and put its token in .env")


def _refuse_retired(environ: Mapping[str, str]) -> None:
    for name, replacement in RETIRED.items():
        if str(environ.get(name) or "").strip():
            raise ConfigError(f"{name} is no longer read: {replacement} (see .env.example)")


def _parse(name: str, type_name: str, raw: str) -> Any:
    if name in _ID_PARSERS:
        return _id_set(name, raw, _ID_PARSERS[name])
    parser = _PARSERS.get(type_name.replace(" ", ""))
    if parser is None:
        return raw
    try:
        return parser(raw)
    except ValueError:
        raise ConfigError(f"{name.upper()} must be {_DESCRIPTIONS[type_name.replace(' ', '')]}, "
                          f"got {shown(raw)}") from None


def _id_set(name: str, raw: str, parse_one: Callable[[str], int]) -> frozenset[int]:
    """Ids separated by commas (or semicolons), each read by the parser /allow uses (bot/ids.py)."""
    try:
        return frozenset(parse_one(part.strip()) for part in raw.replace(";", ",").split(",") if part.strip())
    except IdError as error:
        raise ConfigError(f"{name.upper()} must be a comma-separated list of numeric ids: "
                          f"{redact_token_shapes(str(error))}") from None


def _flag(raw: str) -> bool:
    folded = raw.lower()
    if folded not in _TRUE + _FALSE:
        raise ValueError(raw)
    return folded in _TRUE


_TRUE, _FALSE = ("true", "on", "yes", "1"), ("false", "off", "no", "0")


def shown(value: str) -> str:
    """A bad value as an error message quotes it: never anything shaped like a bot token (a token pasted into
    the wrong variable is still a secret), and never more than a line's worth."""
    value = redact_token_shapes(value)
    return repr(value if len(value) <= SHOWN_CHARS else value[:SHOWN_CHARS] + "…")


SHOWN_CHARS = 60
_ID_PARSERS: dict[str, Callable[[str], int]] = {
    "admin_user_ids": parse_user_id,
    "allowed_user_ids": parse_user_id,
    "allowed_chat_ids": parse_chat_id,
}
_PARSERS: dict[str, Callable[[str], Any]] = {
    "bool": _flag,
    "int": int,
    "float": float,
    "Path": Path,
}
_DESCRIPTIONS = {
    "bool": "true or false (also on/off, yes/no, 1/0)",
    "int": "a whole number",
    "float": "a number",
    "Path": "a path",
}


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {shown(value)}")


def _positive(name: str, value: float) -> None:
    if not value > 0:  # also refuses NaN, which compares false with everything
        raise ConfigError(f"{name} must be greater than 0, got {value}")
