"""The wiring: the bot's shared services, built from `Settings`, started once and closed once.

This is the only place that reads `Settings` into objects of `agent/` and `tools/` (which never import `bot/`).
The Telegram application keeps the services in `bot_data`; the terminal commands use them directly.
"""

from __future__ import annotations

import importlib.util
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from agent.llm import LLM
from agent.grammar import GrammarLimits
from agent.loop import Agent, AgentLimits
from agent.memory import Memory
from agent.options import ChatOptions
from agent.speech.base import SpeechLimits, Transcriber
from agent.summaries import Summarizer, SummaryLimits
from agent.tokens import qwen_token_counter
from bot.program.audit import insert_audit
from bot.program.config import Settings
from bot.program.logs import add_secrets
from db import Database, DatabaseOpenError, open_database
from db.secret_box import SecretBox
from tools import build_registry
from tools.courses import CourseCatalog
from tools.docs import DocsTools
from tools.docs_store import DocumentLibrary
from tools.mcp import McpHub, McpLimits
from tools.mcp_store import read_config, seal_plain_servers
from tools.registry import ToolRegistry
from tools.settings import ToolSettings

log = logging.getLogger(__name__)


@dataclass
class Services:
    """Everything a handler or command needs, wired together."""

    settings: Settings
    db: Database
    llm: LLM
    registry: ToolRegistry
    tool_settings: ToolSettings
    memory: Memory
    catalog: CourseCatalog
    agent: Agent
    mcp: McpHub
    options: ChatOptions
    documents: DocumentLibrary
    summarizer: Summarizer
    speech: Transcriber | None = None  # None: ASR_BACKEND=off (or auto without faster-whisper)

    async def close(self) -> None:
        """Stop the summaries being written, close the MCP connections, stop the model and the speech thread, then
        close the database."""
        try:
            await self.summarizer.close()
            await self.mcp.close()
            await self.llm.close()
            if self.speech is not None:
                await self.speech.close()
        finally:
            await self.db.close()


async def open_settings_database(settings: Settings, *, new_database: bool = False) -> Database:
    """The database at DATABASE_PATH, its secrets sealed (MCP servers stored before migration 0013 are sealed now,
    with the key at SECRETS_KEY_PATH); a path that cannot be used is reported naming the variable. A database
    that existed there and is gone is made anew only with `new_database` (db/marker.py)."""
    with naming_database_path():
        db = await open_database(settings.storage.database_path,
                                 busy_timeout_seconds=settings.storage.database_busy_timeout_seconds,
                                 new_database=new_database)
    try:
        if sealed := await seal_plain_servers(db, secret_box(settings)):
            log.info("sealed the secrets of %d MCP server(s) stored in plain text before", sealed)
    except BaseException:
        await db.close()
        raise
    return db


def secret_box(settings: Settings) -> SecretBox:
    """The box sealing the database's secrets, with its key from SECRETS_KEY_PATH (created on first use)."""
    return SecretBox.at(settings.storage.secrets_key_file)


@contextmanager
def naming_database_path() -> Iterator[None]:
    """A database path that cannot be used (not creatable, a folder, not SQLite) is reported naming DATABASE_PATH:
    db/ knows paths, not the settings they come from."""
    try:
        yield
    except DatabaseOpenError as error:
        raise DatabaseOpenError(f"{error}; check DATABASE_PATH") from error


async def start_services(settings: Settings, llm: LLM | None = None, *, new_database: bool = False) -> Services:
    """Open the database (a new one where one was lost only with `new_database`), start the model (`llm`, or the
    configured backend), build the agent; MCP servers connect in the background (their last known tools are
    registered at once)."""
    add_secrets(settings.secrets())  # whoever builds services (a test, the terminal) gets the redactor fed too
    mcp_config = read_config(settings.mcp.mcp_config_path)  # a broken file stops the start, before anything opens
    db = await open_settings_database(settings, new_database=new_database)
    log.info("database %s", db.path)
    try:
        llm = llm or build_llm(settings)
        log.info("model %s", describe_model(settings, llm))
        await llm.start()
    except BaseException:
        await db.close()
        raise
    catalog = CourseCatalog(db)
    documents = document_library(settings, db)
    registry = build_registry(db, settings.tools.tool_timeout_seconds, settings.tools.course_names_free_text,
                              docs_tools(settings, documents))
    mcp = mcp_hub(settings, db, registry, mcp_config)
    try:
        await mcp.start()
    except BaseException:
        await llm.close()
        await db.close()
        raise
    add_secrets(mcp.secrets())
    tool_settings = ToolSettings(db, registry)
    memory = Memory(db)
    options = ChatOptions(db)
    summarizer = Summarizer(llm, memory, settings.agent.history_token_budget, summary_limits(settings))
    agent = Agent(llm, registry, tool_settings, memory, agent_limits(settings), options, summarizer)
    return Services(settings, db, llm, registry, tool_settings, memory, catalog, agent, mcp, options, documents,
                    summarizer, build_transcriber(settings))


def summary_limits(settings: Settings) -> SummaryLimits:
    """When and how long history summaries are, from SUMMARY_ENABLED, SUMMARY_MAX_TOKENS, SUMMARY_KEEP_TOKENS."""
    memory = settings.memory
    return SummaryLimits(enabled=memory.summary_enabled, max_tokens=memory.summary_max_tokens,
                         keep_tokens=memory.summary_keep_tokens)


def document_library(settings: Settings, db: Database) -> DocumentLibrary:
    """The team's documents in `db`, with the limits of the docs group; its changes are audited."""
    return DocumentLibrary(db, settings.docs.limits(), audit=insert_audit)


def docs_tools(settings: Settings, library: DocumentLibrary) -> DocsTools:
    """`docs_search` and `docs_read` over `library`, answering within OBSERVATION_MAX_CHARS."""
    return DocsTools(library, settings.agent.observation_max_chars)


def mcp_hub(settings: Settings, db: Database, registry: ToolRegistry, config: list | None = None) -> McpHub:
    """The MCP hub for `settings` (the config file read unless `config` is given), not started yet."""
    mcp = settings.mcp
    limits = McpLimits(connect_timeout_seconds=mcp.mcp_connect_timeout_seconds, retry_seconds=mcp.mcp_retry_seconds,
                       max_tools_per_server=mcp.mcp_max_tools_per_server,
                       description_max_chars=mcp.mcp_description_max_chars,
                       allow_private_addresses=mcp.mcp_allow_private_addresses)
    return McpHub(db, registry, config=read_config(mcp.mcp_config_path) if config is None else config, limits=limits,
                  box=secret_box(settings))


def agent_limits(settings: Settings) -> AgentLimits:
    """The agent's limits and decoding rules from MAX_STEPS, MAX_NEW_TOKENS, CONSTRAINED_DECODING and the rest."""
    agent = settings.agent
    grammar = GrammarLimits(thought_max_tokens=agent.thought_max_tokens, string_max_chars=agent.tool_string_max_chars,
                            answer_max_tokens=agent.answer_max_tokens)
    return AgentLimits(max_steps=agent.max_steps, max_new_tokens=agent.max_new_tokens,
                       history_token_budget=agent.history_token_budget,
                       observation_max_chars=agent.observation_max_chars,
                       turn_timeout_seconds=agent.turn_timeout_seconds, mode=agent.agent_mode,
                       react_layout=agent.react_layout, grammar=grammar if agent.constrained_decoding else None,
                       require_tool_call=agent.require_tool_call, grounded_answers=agent.grounded_answers,
                       extra_tool_calls=agent.extra_tool_calls,
                       last_observations_tokens=settings.memory.last_observations_tokens,
                       default_persona=settings.conversations.default_persona)


def build_llm(settings: Settings) -> LLM:
    """The backend LLM_BACKEND names; nothing loads or connects until `start()`, and heavy imports happen only
    for the backend chosen."""
    model = settings.model
    if model.llm_backend == "local":
        return local_llm(settings)
    if model.llm_backend == "openai":
        return openai_llm(settings)
    from agent.llm.scripted import ScriptedLLM

    scripted = settings.scripted
    return ScriptedLLM.from_file(scripted.scripted_replies_path, delay=scripted.scripted_delay_seconds,
                                 token_seconds=scripted.scripted_token_seconds,
                                 count_tokens=qwen_token_counter(model.tokenizer_vocab_path))


def local_llm(settings: Settings) -> LLM:
    """The local engine, from the model and engine groups (LLM_BACKEND=local)."""
    from agent.llm.engine.speculative import SpeculativeLimits
    from agent.llm.local import LocalLLM

    model, engine = settings.model, settings.engine
    speculative = SpeculativeLimits(per_row=engine.speculative_tokens, per_step=engine.speculative_step_tokens)
    return LocalLLM(model.model, device_map=model.model_device_map, dtype=model.model_dtype,
                    batch_size=engine.batch_size, batch_wait_ms=engine.batch_wait_ms,
                    converted_dir=model.model_converted_dir, prefix_cache_mb=engine.prefix_cache_megabytes(),
                    base_dir=settings.storage.data_dir, cache_dir=model.model_cache_dir,
                    native_tools=settings.agent.agent_mode == "native", speculative=speculative,
                    low_priority_rows=engine.low_priority_rows, kernel_cache_entries=engine.kernel_cache_entries,
                    int8_kept=model.model_int8_kept)


def openai_llm(settings: Settings) -> LLM:
    """The client of an OpenAI-compatible server, from the openai group (LLM_BACKEND=openai)."""
    from agent.llm.openai import OpenAILLM
    from agent.llm.openai_stream import StreamLimits

    openai = settings.openai
    limits = StreamLimits(connect_seconds=openai.openai_connect_timeout_seconds,
                          first_token_seconds=openai.openai_first_token_seconds,
                          silence_seconds=openai.openai_silence_seconds)
    return OpenAILLM(base_url=openai.openai_base_url, model=openai.openai_model or settings.model.model,
                     api_key=openai.openai_api_key, limits=limits, startup_seconds=openai.openai_startup_seconds,
                     server_wait_seconds=openai.openai_server_wait_seconds,
                     max_retries=openai.openai_max_retries,
                     count_tokens=qwen_token_counter(settings.model.tokenizer_vocab_path),
                     grammar=openai.openai_grammar, vision=openai.openai_vision,
                     low_priority_concurrency=openai.openai_low_priority_concurrency)


def speech_backend(settings: Settings) -> str:
    """ASR_BACKEND as it applies here: `auto` is `local` where faster-whisper is installed, else `off`."""
    backend = settings.voice.asr_backend
    if backend == "auto":
        return "local" if importlib.util.find_spec("faster_whisper") is not None else "off"
    return backend


def build_transcriber(settings: Settings) -> Transcriber | None:
    """The speech backend ASR_BACKEND names (None for off); nothing loads or connects until the first recording."""
    voice = settings.voice
    limits = SpeechLimits(max_seconds=voice.asr_max_seconds, max_file_mb=voice.asr_max_file_mb,
                          timeout_seconds=voice.asr_timeout_seconds)
    backend = speech_backend(settings)
    if backend == "local":
        from agent.speech.local import LocalTranscriber

        return LocalTranscriber(voice.asr_model, device=voice.asr_device, compute_type=voice.asr_compute_type,
                                cpu_threads=voice.asr_cpu_threads, language=voice.asr_language, limits=limits,
                                base_dir=settings.storage.data_dir, cache_dir=settings.model.model_cache_dir)
    if backend == "openai":
        from agent.llm.openai_stream import StreamLimits
        from agent.speech.openai import OpenAITranscriber

        openai = settings.openai
        time_limits = StreamLimits(connect_seconds=openai.openai_connect_timeout_seconds,
                                   first_token_seconds=openai.openai_first_token_seconds,
                                   silence_seconds=openai.openai_silence_seconds)
        return OpenAITranscriber(base_url=voice.asr_base_url or openai.openai_base_url, model=voice.asr_model,
                                 api_key=voice.asr_api_key or openai.openai_api_key, language=voice.asr_language,
                                 limits=limits, time_limits=time_limits, max_retries=openai.openai_max_retries)
    return None


def describe_model(settings: Settings, llm: LLM) -> str:
    """Which model runs, and where it comes from, for the start-up log (a server's URL without credentials)."""
    url = getattr(llm, "url", None)
    if url is not None:
        return f"{getattr(llm, 'model', settings.model.model)} on the server at {url}"
    if llm.name == "local":
        return (f"{settings.model.model} (local; relative paths in {settings.storage.data_dir}, "
                f"hub cache {settings.model.model_cache_dir})")
    return f"{llm.name} backend"
