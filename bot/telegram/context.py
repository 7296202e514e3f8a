"""The handlers' context: python-telegram-bot's `CallbackContext` with typed accessors for our services.

Everything shared lives in `application.bot_data` under the keys below, put there by `post_init`; handlers read
it only through these properties (see python-telegram-bot's `contexttypesbot.py` example).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from telegram.ext import CallbackContext, ExtBot

from bot.program.config import Settings
from bot.program.metrics import BotMetrics
from bot.telegram.access import AccessControl
from bot.telegram.deliveries import DeliveryLedger
from bot.telegram.progress import ProgressLedger
from bot.telegram.quotas import Quotas
from bot.telegram.refusals import RefusalLog
from bot.telegram.streaming import DraftSupport
from bot.telegram.turns import TurnScheduler

if TYPE_CHECKING:
    from bot.program.services import Services

SERVICES = "services"
ACCESS = "access"
TURNS = "turns"
SETTINGS = "settings"
REFUSALS = "refusals"
DRAFTS = "drafts"
PROGRESS = "progress"
QUOTAS = "quotas"
DELIVERIES = "deliveries"
METRICS = "metrics"
TELEGRAM_CALLS = "telegram_calls"
HEALTH = "health"


class BotContext(CallbackContext[ExtBot, dict, dict, dict]):
    """The context every handler receives."""

    @property
    def settings(self) -> Settings:
        """The bot's settings."""
        return self.bot_data[SETTINGS]

    @property
    def services(self) -> "Services":
        """Database, model, agent, tools and memory, started by `post_init`."""
        return self.bot_data[SERVICES]

    @property
    def access(self) -> AccessControl:
        """Access decisions."""
        return self.bot_data[ACCESS]

    @property
    def progress(self) -> ProgressLedger:
        """The progress messages on screen (bot/telegram/progress.py)."""
        return self.bot_data[PROGRESS]

    @property
    def deliveries(self) -> DeliveryLedger:
        """The pieces of answers Telegram took (bot/telegram/deliveries.py)."""
        return self.bot_data[DELIVERIES]

    @property
    def quotas(self) -> Quotas:
        """Users' daily limits and what they used today (bot/telegram/quotas.py)."""
        return self.bot_data[QUOTAS]

    @property
    def turns(self) -> TurnScheduler:
        """Where each question waits for its turn."""
        return self.bot_data[TURNS]

    @property
    def refusals(self) -> RefusalLog:
        """Who was refused lately (told once per REFUSAL_INTERVAL_SECONDS)."""
        return self.bot_data[REFUSALS]

    @property
    def metrics(self) -> BotMetrics:
        """The bot's Prometheus metrics (bot/program/metrics.py), put there by `build_application`."""
        return self.bot_data[METRICS]

    @property
    def drafts(self) -> DraftSupport:
        """Whether the Bot API server takes message drafts (learnt from its first refusal)."""
        return self.bot_data[DRAFTS]


def runtime_data(settings: Settings, services: "Services") -> dict[str, Any]:
    """The `bot_data` entries `post_init` installs."""
    return {SETTINGS: settings, SERVICES: services, ACCESS: AccessControl(services.db, settings),
            TURNS: TurnScheduler(), REFUSALS: RefusalLog(settings.access.refusal_interval_seconds),
            DRAFTS: DraftSupport(), PROGRESS: ProgressLedger(services.db), DELIVERIES: DeliveryLedger(services.db),
            QUOTAS: Quotas(services.db, settings.quotas)}
