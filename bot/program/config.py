"""Settings: every knob of the bot, read once from the environment (and `.env`), in groups by component.

    settings.telegram.telegram_bot_token     TELEGRAM_BOT_TOKEN
    settings.agent.max_steps                 MAX_STEPS

`Settings` is one frozen object made of small frozen groups (telegram, webhook, access, storage, model, engine,
openai, scripted, agent, memory, tools, docs, turns, quotas, conversations, streaming, voice, images, mcp, logging,
metrics, doctor), each the one place of its defaults. A field is named as its variable in lower case, so the
variables never changed with the grouping and a grep for either finds both. Where a component of `agent/` or `tools/`
has a limits class (`AgentLimits`, `GrammarLimits`, `SpeculativeLimits`, `StreamLimits`, `SpeechLimits`,
`McpLimits`, `DocsLimits`, `SummaryLimits`) or
a named default, the group takes its default from there, so each default is written once; bot/program/services.py
builds those classes from the groups by keyword.

Each variable is mirrored, with its default and an explanation, in `.env.example`, in one section per group.
Tests build settings with `Settings.of(max_steps=3, …)` (flat keywords, named as the fields), `settings.replaced(…)`,
or `Settings.from_env({...})` with an explicit mapping.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping, get_type_hints

from dotenv import load_dotenv

from agent.grammar import GrammarLimits
from agent.llm.base import MODEL_DTYPES
from agent.llm.engine.admission import BatchLimits
from agent.llm.engine.speculative import SpeculativeLimits
from agent.llm.engine.kernel_cache import KERNEL_CACHE_ENTRIES
from agent.llm.engine.saved_int8 import KEPT as INT8_KEPT
from agent.llm.openai_stream import ServerLimits, StreamLimits
from agent.loop import AgentLimits
from agent.prompts import REACT_LAYOUTS
from agent.speech.base import SpeechLimits
from agent.summaries import SummaryLimits
from bot.program.env import ConfigError, not_negative, one_of, parse, positive, shown
from bot.program.logs import LOG_FORMATS
from bot.program.paths import default_data_dir, dotenv_file, moved_database, under
from core.secrets import url_secrets
from db.secret_box import key_file_beside
from db.connection import BUSY_TIMEOUT_SECONDS
from tools.docs_store import MB, DocsLimits
from tools.mcp import McpLimits
from tools.registry import TOOL_TIMEOUT_SECONDS

__all__ = ["ConfigError", "Settings"]

LLM_BACKENDS = ("local", "openai", "scripted")
AGENT_MODES = ("react", "native")
OPENAI_GRAMMARS = ("off", "vllm", "sglang", "llama.cpp")
OPENAI_VISIONS = ("auto", "on", "off")
ASR_BACKENDS = ("auto", "local", "openai", "off")
ASR_DEVICES = ("cpu", "cuda", "auto")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TELEGRAM_DOCUMENT_MAX_BYTES = 50_000_000  # the Bot API's limit for a document a bot sends
# Settings that no longer exist, and what replaced them: a .env that still sets one is told, not silently ignored.
RETIRED = {
    "OPENAI_TIMEOUT_SECONDS": "the openai backend now has OPENAI_CONNECT_TIMEOUT_SECONDS, OPENAI_FIRST_TOKEN_SECONDS "
                              "and OPENAI_SILENCE_SECONDS instead of one deadline per call",
}


@dataclass(frozen=True)
class TelegramSettings:
    """Which bot, at which Bot API server, and how fast it may send there."""

    telegram_bot_token: str = ""
    telegram_base_url: str = "https://api.telegram.org/bot"
    telegram_base_file_url: str = ""  # where files are downloaded from; empty: TELEGRAM_BASE_URL's …/bot as …/file/bot
    telegram_messages_per_second: float = 30.0
    telegram_group_messages_per_minute: float = 20.0
    telegram_download_timeout_seconds: float = 60.0

    def validate(self) -> None:
        """Refuse a download time limit that is not positive."""
        positive(self, ("telegram_download_timeout_seconds",))

    def file_url(self) -> str:
        """Where the bot downloads files (getFile's paths): TELEGRAM_BASE_FILE_URL, else TELEGRAM_BASE_URL with its
        /bot ending as /file/bot, as the Bot API serves them (api.telegram.org/bot → api.telegram.org/file/bot)."""
        if self.telegram_base_file_url:
            return self.telegram_base_file_url
        base = self.telegram_base_url.rstrip("/")
        return base[:-len("/bot")] + "/file/bot" if base.endswith("/bot") else base + "/file/bot"


@dataclass(frozen=True)
class WebhookSettings:
    """Webhook mode (WEBHOOK_URL set) instead of long polling."""

    webhook_url: str = ""
    webhook_listen: str = "127.0.0.1"
    webhook_port: int = 8443
    webhook_secret_token: str = ""
    webhook_max_body_bytes: int = 1_048_576

    def validate(self) -> None:
        """Refuse a port or body limit that cannot work."""
        if self.webhook_port > 65535:
            raise ConfigError(f"WEBHOOK_PORT must be at most 65535, got {self.webhook_port}")
        positive(self, ("webhook_port", "webhook_max_body_bytes"))


@dataclass(frozen=True)
class AccessSettings:
    """Who may talk to the bot, who is an admin, and how often a stranger is told no."""

    admin_user_ids: frozenset[int] = field(default_factory=frozenset)
    allowed_user_ids: frozenset[int] = field(default_factory=frozenset)
    allowed_chat_ids: frozenset[int] = field(default_factory=frozenset)
    refusal_interval_seconds: float = 3600.0

    def validate(self) -> None:
        """Refuse a negative refusal interval."""
        not_negative(self, ("refusal_interval_seconds",))


@dataclass(frozen=True)
class StorageSettings:
    """The data directory and the database in it. Relative paths are taken inside DATA_DIR here."""

    data_dir: Path = field(default_factory=default_data_dir)
    database_path: Path = Path("bot.sqlite3")
    database_busy_timeout_seconds: float = BUSY_TIMEOUT_SECONDS
    database_check_seconds: float = 2.0
    instance_lock_wait_seconds: float = 30.0
    secrets_key_path: str = ""  # empty: secrets.key beside the database

    @property
    def secrets_key_file(self) -> Path:
        """The key that seals the database's secrets (db/secret_box.py): SECRETS_KEY_PATH (inside DATA_DIR when
        relative), or a file beside the database."""
        if self.secrets_key_path:
            return under(self.data_dir, Path(self.secrets_key_path))
        return key_file_beside(self.database_path)

    def __post_init__(self) -> None:
        """Make DATA_DIR and the database path absolute, so neither depends on the folder `qwenbot` runs in."""
        data_dir = self.data_dir.expanduser()
        if not data_dir.is_absolute():
            raise ConfigError(f"DATA_DIR must be an absolute path, got {shown(str(self.data_dir))}")
        object.__setattr__(self, "data_dir", data_dir)
        if (old := moved_database(data_dir, self.database_path)) is not None:
            raise ConfigError(f"DATABASE_PATH is now relative to DATA_DIR ({data_dir}), so {self.database_path} "
                              f"no longer names your database {old}: set DATABASE_PATH={old.relative_to(data_dir)}")
        object.__setattr__(self, "database_path", under(data_dir, self.database_path))

    def validate(self) -> None:
        """Refuse check intervals and waits that make no sense."""
        positive(self, ("database_check_seconds",))
        not_negative(self, ("instance_lock_wait_seconds",))


@dataclass(frozen=True)
class ModelSettings:
    """Which model answers, through which backend, and where its files are kept."""

    llm_backend: str = "local"
    model: str = "Qwen/Qwen2.5-1.5B-Instruct"
    model_device_map: str = "auto"
    model_dtype: str = "auto"
    model_cache_dir: Path = Path("models")
    model_converted_dir: Path = Path("converted-models")
    model_int8_kept: int = INT8_KEPT  # models whose int8 weights stay saved there (engine/saved_int8.py)
    tokenizer_vocab_path: Path = Path("qwen.tiktoken")

    def validate(self) -> None:
        """Refuse a backend or dtype the bot does not have, a negative count of saved int8 models."""
        one_of("LLM_BACKEND", self.llm_backend, LLM_BACKENDS)
        one_of("MODEL_DTYPE", self.model_dtype, MODEL_DTYPES)
        not_negative(self, ("model_int8_kept",))


@dataclass(frozen=True)
class EngineSettings:
    """The local engine: batches, the prefix store, speculative tokens (the local backend only)."""

    batch_size: int = BatchLimits.batch_size
    batch_wait_ms: int = BatchLimits.batch_wait_ms
    prefix_cache_mb: str = "auto"  # auto: the KV of PREFIX_CACHE_TOKENS tokens of the model (engine/memory.py)
    speculative_tokens: int = SpeculativeLimits.per_row
    speculative_step_tokens: int = SpeculativeLimits.per_step
    low_priority_rows: int = BatchLimits.low_priority_rows
    kernel_cache_entries: int = KERNEL_CACHE_ENTRIES  # oneDNN's compiled kernels kept (engine/kernel_cache.py)

    def validate(self) -> None:
        """Refuse an empty batch, negative sizes, a prefix store size that is neither auto nor MiB."""
        positive(self, ("batch_size", "low_priority_rows"))
        not_negative(self, ("batch_wait_ms", "speculative_tokens", "speculative_step_tokens", "kernel_cache_entries"))
        self.prefix_cache_megabytes()

    def prefix_cache_megabytes(self) -> int | None:
        """PREFIX_CACHE_MB as MiB, or None for auto (sized from the model once it is loaded)."""
        if self.prefix_cache_mb.strip().lower() == "auto":
            return None
        try:
            size = int(self.prefix_cache_mb)
        except ValueError:
            size = -1
        if size < 0:
            raise ConfigError(f"PREFIX_CACHE_MB must be auto or a whole number of MiB (0: off), "
                              f"got {shown(self.prefix_cache_mb)}")
        return size


@dataclass(frozen=True)
class OpenAISettings:
    """The OpenAI-compatible server of the openai backend, and how long to wait for it."""

    openai_base_url: str = "http://127.0.0.1:8000/v1"
    openai_api_key: str = "EMPTY"
    openai_model: str = ""
    openai_connect_timeout_seconds: float = StreamLimits.connect_seconds
    openai_first_token_seconds: float = StreamLimits.first_token_seconds
    openai_silence_seconds: float = StreamLimits.silence_seconds
    openai_startup_seconds: float = ServerLimits.startup_seconds
    openai_server_wait_seconds: float = ServerLimits.server_wait_seconds
    openai_max_retries: int = ServerLimits.max_retries
    openai_grammar: str = "off"
    openai_low_priority_concurrency: int = ServerLimits.low_priority_concurrency
    openai_vision: str = "auto"

    def validate(self) -> None:
        """Refuse deadlines that are not positive, negative retries, an unknown grammar dialect or vision value."""
        one_of("OPENAI_GRAMMAR", self.openai_grammar, OPENAI_GRAMMARS)
        one_of("OPENAI_VISION", self.openai_vision, OPENAI_VISIONS)
        positive(self, ("openai_connect_timeout_seconds", "openai_first_token_seconds", "openai_silence_seconds",
                        "openai_startup_seconds", "openai_low_priority_concurrency"))
        not_negative(self, ("openai_max_retries", "openai_server_wait_seconds"))


@dataclass(frozen=True)
class ScriptedSettings:
    """The scripted backend (tests and demos): replies replayed from a file."""

    scripted_replies_path: str = ""
    scripted_delay_seconds: float = 0.0
    scripted_token_seconds: float = 0.0

    def validate(self) -> None:
        """Refuse negative delays."""
        not_negative(self, ("scripted_delay_seconds", "scripted_token_seconds"))


@dataclass(frozen=True)
class AgentSettings:
    """The agent's loop and decoding rules; defaults from `AgentLimits` and `GrammarLimits` (agent/)."""

    agent_mode: str = AgentLimits.mode
    react_layout: str = AgentLimits.react_layout
    max_steps: int = AgentLimits.max_steps
    max_new_tokens: int = AgentLimits.max_new_tokens
    constrained_decoding: bool = AgentLimits.grammar is not None
    thought_max_tokens: int = GrammarLimits.thought_max_tokens
    tool_string_max_chars: int = GrammarLimits.string_max_chars
    answer_max_tokens: int = GrammarLimits.answer_max_tokens
    require_tool_call: bool = AgentLimits.require_tool_call
    extra_tool_calls: int = AgentLimits.extra_tool_calls
    grounded_answers: bool = AgentLimits.grounded_answers
    history_token_budget: int = AgentLimits.history_token_budget
    observation_max_chars: int = AgentLimits.observation_max_chars
    turn_timeout_seconds: float = AgentLimits.turn_timeout_seconds

    def validate(self) -> None:
        """Refuse an unknown mode or layout, and limits that are not positive."""
        one_of("AGENT_MODE", self.agent_mode, AGENT_MODES)
        one_of("REACT_LAYOUT", self.react_layout, REACT_LAYOUTS)
        not_negative(self, ("extra_tool_calls",))
        positive(self, ("max_steps", "max_new_tokens", "thought_max_tokens", "tool_string_max_chars", "answer_max_tokens",
                        "history_token_budget", "observation_max_chars", "turn_timeout_seconds"))


@dataclass(frozen=True)
class MemorySettings:
    """What a chat remembers beyond HISTORY_TOKEN_BUDGET: the running summary of its older turns, and the last
    turn's observations; defaults from `SummaryLimits` and `AgentLimits` (agent/)."""

    summary_enabled: bool = SummaryLimits.enabled
    summary_max_tokens: int = SummaryLimits.max_tokens
    summary_keep_tokens: int = SummaryLimits.keep_tokens
    last_observations_tokens: int = AgentLimits.last_observations_tokens

    def validate(self) -> None:
        """Refuse a summary with no room, and negative sizes."""
        positive(self, ("summary_max_tokens", "summary_keep_tokens"))
        not_negative(self, ("last_observations_tokens",))


@dataclass(frozen=True)
class ToolsSettings:
    """The built-in tools: their time limit and how course names are taken."""

    course_names_free_text: bool = False
    tool_timeout_seconds: float = TOOL_TIMEOUT_SECONDS

    def validate(self) -> None:
        """Refuse a time limit that is not positive."""
        positive(self, ("tool_timeout_seconds",))


@dataclass(frozen=True)
class DocsSettings:
    """The team's documents (`docs_search`, `docs_read`): sizes and budget, chunks, results; defaults from
    `DocsLimits` (tools/docs_store.py)."""

    docs_max_file_mb: float = DocsLimits.max_file_bytes / MB
    docs_max_total_mb: float = DocsLimits.max_total_bytes / MB
    docs_chunk_chars: int = DocsLimits.chunk_chars
    docs_search_results: int = DocsLimits.search_results
    docs_max_unpacked_mb: float = DocsLimits.max_unpacked_bytes / MB
    docs_max_zip_ratio: float = DocsLimits.max_zip_ratio

    def validate(self) -> None:
        """Refuse sizes and counts that are not positive, and chunks too small to hold a sentence."""
        positive(self, ("docs_max_file_mb", "docs_max_total_mb", "docs_search_results", "docs_max_unpacked_mb",
                        "docs_max_zip_ratio"))
        if self.docs_chunk_chars < 100:
            raise ConfigError(f"DOCS_CHUNK_CHARS must be at least 100, got {self.docs_chunk_chars}")

    def limits(self) -> DocsLimits:
        """The library's limits in bytes."""
        return DocsLimits(max_file_bytes=int(self.docs_max_file_mb * MB),
                          max_total_bytes=int(self.docs_max_total_mb * MB),
                          chunk_chars=self.docs_chunk_chars, search_results=self.docs_search_results,
                          max_unpacked_bytes=int(self.docs_max_unpacked_mb * MB),
                          max_zip_ratio=self.docs_max_zip_ratio)


@dataclass(frozen=True)
class TurnsSettings:
    """A question's way through: how many may wait, how long it may be, how its answer is delivered, and how
    long running turns get at shutdown."""

    max_pending_questions: int = 10
    max_question_chars: int = 4096
    shutdown_grace_seconds: float = 10.0
    send_patience_seconds: float = 30.0
    answer_resend_seconds: float = 5.0
    answer_save_wait_seconds: float = 120.0

    def validate(self) -> None:
        """Refuse limits and waits that are not positive."""
        positive(self, ("max_pending_questions", "max_question_chars", "send_patience_seconds",
                        "answer_resend_seconds", "answer_save_wait_seconds"))


@dataclass(frozen=True)
class QuotasSettings:
    """Daily limits per user (a UTC day), counted from the turns table; admins are exempt, and /quota_set sets a
    user's own. 0 = unlimited."""

    user_daily_turns: int = 0
    user_daily_tokens: int = 0

    def validate(self) -> None:
        """Refuse negative limits."""
        not_negative(self, ("user_daily_turns", "user_daily_tokens"))


@dataclass(frozen=True)
class ConversationsSettings:
    """Per chat: the persona of chats without their own, how long one may be, and /export's size."""

    default_persona: str = AgentLimits.default_persona
    persona_max_chars: int = 1000
    export_max_bytes: int = 5_000_000

    def validate(self) -> None:
        """Refuse sizes that are not positive, and an export past Telegram's 50 MB for a bot's document."""
        positive(self, ("persona_max_chars", "export_max_bytes"))
        if self.export_max_bytes > TELEGRAM_DOCUMENT_MAX_BYTES:
            raise ConfigError(f"EXPORT_MAX_BYTES must be at most {TELEGRAM_DOCUMENT_MAX_BYTES} (Telegram's limit for "
                              f"a document a bot sends), got {self.export_max_bytes}")
        if len(self.default_persona) > self.persona_max_chars:
            raise ConfigError(f"DEFAULT_PERSONA must be at most PERSONA_MAX_CHARS ({self.persona_max_chars}) "
                              f"characters, got {len(self.default_persona)}")


@dataclass(frozen=True)
class StreamingSettings:
    """What a user sees while a turn runs: typing, the progress line, the answer streamed."""

    progress_after_seconds: float = 2.0
    typing_interval_seconds: float = 4.0
    stream_interval_seconds: float = 1.0
    group_stream_interval_seconds: float = 3.0

    def validate(self) -> None:
        """Refuse intervals that are not positive."""
        positive(self, ("typing_interval_seconds", "stream_interval_seconds", "group_stream_interval_seconds"))


@dataclass(frozen=True)
class VoiceSettings:
    """Questions asked by voice: the speech-to-text backend, its model, and the limits of a recording (defaults of
    the limits from `SpeechLimits`, agent/speech/base.py)."""

    asr_backend: str = "auto"  # auto: local when faster-whisper is installed, else off
    asr_model: str = "base"
    asr_language: str = ""
    asr_device: str = "cpu"
    asr_compute_type: str = "int8"
    asr_cpu_threads: int = 2
    asr_base_url: str = ""
    asr_api_key: str = ""
    asr_max_seconds: float = SpeechLimits.max_seconds
    asr_max_file_mb: float = SpeechLimits.max_file_mb
    asr_timeout_seconds: float = SpeechLimits.timeout_seconds

    def validate(self) -> None:
        """Refuse an unknown backend or device, and limits that are not positive."""
        one_of("ASR_BACKEND", self.asr_backend, ASR_BACKENDS)
        one_of("ASR_DEVICE", self.asr_device, ASR_DEVICES)
        positive(self, ("asr_max_seconds", "asr_max_file_mb", "asr_timeout_seconds"))
        not_negative(self, ("asr_cpu_threads",))


@dataclass(frozen=True)
class ImagesSettings:
    """Questions about a picture: how large a picture may be downloaded, and the size it is shrunk to."""

    image_max_side: int = 1024
    image_max_file_mb: float = 20.0

    def validate(self) -> None:
        """Refuse sizes that are not positive."""
        positive(self, ("image_max_side", "image_max_file_mb"))


@dataclass(frozen=True)
class McpSettings:
    """MCP servers: the config file, and the limits of `McpLimits` (tools/mcp.py) for their defaults."""

    mcp_config_path: str = ""
    mcp_connect_timeout_seconds: float = McpLimits.connect_timeout_seconds
    mcp_retry_seconds: float = McpLimits.retry_seconds
    mcp_max_tools_per_server: int = McpLimits.max_tools_per_server
    mcp_description_max_chars: int = McpLimits.description_max_chars
    mcp_allow_private_addresses: bool = McpLimits.allow_private_addresses

    def validate(self) -> None:
        """Refuse limits that are not positive, and a negative retry pause."""
        positive(self, ("mcp_connect_timeout_seconds", "mcp_max_tools_per_server", "mcp_description_max_chars"))
        not_negative(self, ("mcp_retry_seconds",))


@dataclass(frozen=True)
class LoggingSettings:
    """How much the log says, and in which form."""

    log_level: str = "INFO"
    log_format: str = "text"

    def validate(self) -> None:
        """logging.basicConfig raises (a traceback) on an unknown level name, so refuse it here; and a format
        that is not text or json."""
        one_of("LOG_LEVEL", self.log_level.upper(), LOG_LEVELS)
        one_of("LOG_FORMAT", self.log_format, LOG_FORMATS)


@dataclass(frozen=True)
class MetricsSettings:
    """The Prometheus and health endpoint (/metrics, /healthz; off unless METRICS_PORT is set), and what /healthz
    calls unwell."""

    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    health_model_stall_seconds: float = 300.0
    health_telegram_seconds: float = 60.0
    health_check_timeout_seconds: float = 5.0

    def validate(self) -> None:
        """Refuse a port that cannot be, and limits that are not positive."""
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"METRICS_PORT must be 0 (off) or a port up to 65535, got {self.metrics_port}")
        positive(self, ("health_model_stall_seconds", "health_telegram_seconds", "health_check_timeout_seconds"))


@dataclass(frozen=True)
class DoctorSettings:
    """`qwenbot doctor`'s thresholds."""

    doctor_min_free_disk_mb: int = 2000
    doctor_timeout_seconds: float = 10.0

    def validate(self) -> None:
        """Refuse a negative disk threshold and a timeout that is not positive."""
        not_negative(self, ("doctor_min_free_disk_mb",))
        positive(self, ("doctor_timeout_seconds",))


@dataclass(frozen=True)
class Settings:
    """The bot's configuration: one group per component. Field `foo_bar` of a group is read from `FOO_BAR`."""

    telegram: TelegramSettings = field(default_factory=TelegramSettings)
    webhook: WebhookSettings = field(default_factory=WebhookSettings)
    access: AccessSettings = field(default_factory=AccessSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    engine: EngineSettings = field(default_factory=EngineSettings)
    openai: OpenAISettings = field(default_factory=OpenAISettings)
    scripted: ScriptedSettings = field(default_factory=ScriptedSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)
    memory: MemorySettings = field(default_factory=MemorySettings)
    tools: ToolsSettings = field(default_factory=ToolsSettings)
    docs: DocsSettings = field(default_factory=DocsSettings)
    turns: TurnsSettings = field(default_factory=TurnsSettings)
    quotas: QuotasSettings = field(default_factory=QuotasSettings)
    conversations: ConversationsSettings = field(default_factory=ConversationsSettings)
    streaming: StreamingSettings = field(default_factory=StreamingSettings)
    voice: VoiceSettings = field(default_factory=VoiceSettings)
    images: ImagesSettings = field(default_factory=ImagesSettings)
    mcp: McpSettings = field(default_factory=McpSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    doctor: DoctorSettings = field(default_factory=DoctorSettings)

    def __post_init__(self) -> None:
        """Take the model's files and the MCP config file inside DATA_DIR, as the database is (StorageSettings)."""
        data_dir = self.storage.data_dir
        model = self.model
        object.__setattr__(self, "model", replace(
            model, model_cache_dir=under(data_dir, model.model_cache_dir),
            model_converted_dir=under(data_dir, model.model_converted_dir),
            tokenizer_vocab_path=under(data_dir, model.tokenizer_vocab_path)))
        if self.mcp.mcp_config_path:  # empty: no file
            object.__setattr__(self, "mcp", replace(
                self.mcp, mcp_config_path=str(under(data_dir, Path(self.mcp.mcp_config_path)))))

    @classmethod
    def of(cls, **values: Any) -> "Settings":
        """Settings from flat keywords named as the fields (`Settings.of(max_steps=3, data_dir=…)`), the rest
        defaults; a name that is no setting is a TypeError, as a wrong keyword is."""
        return cls()._with(values, defaults=True)

    def replaced(self, **values: Any) -> "Settings":
        """These settings with the fields named in `values` (flat, as in `of`) changed."""
        return self._with(values, defaults=False)

    def _with(self, values: dict[str, Any], defaults: bool) -> "Settings":
        unknown = set(values) - set(_GROUP_OF)
        if unknown:
            raise TypeError(f"no such setting: {', '.join(sorted(unknown))}")
        groups = {}
        for spec in fields(self):
            mine = {name: value for name, value in values.items() if _GROUP_OF[name] == spec.name}
            if defaults:
                groups[spec.name] = _GROUPS[spec.name](**mine)
            else:
                groups[spec.name] = replace(getattr(self, spec.name), **mine) if mine else getattr(self, spec.name)
        return Settings(**groups)

    @classmethod
    def variables(cls) -> list[str]:
        """Every variable read, group by group, in the order of `.env.example`."""
        return [name.upper() for name in _GROUP_OF]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, dotenv: bool = True) -> "Settings":
        """Read settings from `environ` (default: the process environment, after loading `.env`)."""
        if environ is None:
            if dotenv:
                load_dotenv(dotenv_file())
            environ = os.environ
        _refuse_retired(environ)
        values: dict[str, Any] = {}
        for name, type_name in _TYPES.items():
            raw = environ.get(name.upper())
            if raw is not None and raw.strip() != "":
                values[name] = parse(name, type_name, raw.strip())
        settings = cls.of(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Refuse values that parse but make no sense, naming the variable (each group checks its own)."""
        for spec in fields(self):
            check = getattr(getattr(self, spec.name), "validate", None)
            if check is not None:
                check()
        if self.memory.summary_keep_tokens >= self.agent.history_token_budget:
            raise ConfigError(f"SUMMARY_KEEP_TOKENS ({self.memory.summary_keep_tokens}) must be below "
                              f"HISTORY_TOKEN_BUDGET ({self.agent.history_token_budget}): a fold keeps that many "
                              "tokens of whole turns")

    def secrets(self) -> list[str]:
        """Every secret the settings hold, for the redactor (core/secrets.py): the bot token, the webhook secret,
        the OpenAI and speech API keys, and the credentials in the Bot API, webhook, OpenAI and speech URLs."""
        urls = (self.telegram.telegram_base_url, self.webhook.webhook_url, self.openai.openai_base_url,
                self.voice.asr_base_url)
        return [self.telegram.telegram_bot_token, self.webhook.webhook_secret_token, self.openai.openai_api_key,
                self.voice.asr_api_key, *(secret for url in urls for secret in url_secrets(url))]

    def require_telegram_token(self) -> None:
        """`qwenbot run` cannot start without a token; say so in one line."""
        if not self.telegram.telegram_bot_token:
            raise ConfigError("TELEGRAM_BOT_TOKEN is not set: create a bot with @BotFather and put its token in .env")


_GROUPS: dict[str, type] = get_type_hints(Settings)  # group name → its class
# Each field's group, and its type as annotated (the parsers in bot/program/env.py go by it), in variable order.
_GROUP_OF: dict[str, str] = {spec.name: group for group, cls in _GROUPS.items() for spec in fields(cls)}
_TYPES: dict[str, str] = {spec.name: str(spec.type) for cls in _GROUPS.values() for spec in fields(cls)}


def _refuse_retired(environ: Mapping[str, str]) -> None:
    for name, replacement in RETIRED.items():
        if str(environ.get(name) or "").strip():
            raise ConfigError(f"{name} is no longer read: {replacement} (see .env.example)")
