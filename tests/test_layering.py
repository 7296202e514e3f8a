"""The packages' layering as a user of the engine sees it: loading the local engine loads no database, tools or
bot, and every error a user may see derives from one root that no package owns (core/errors.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.errors import AgentError, LLMError
from bot.program.config import ConfigError
from bot.program.evaluation import EvalFileError
from core.errors import BotError
from db.errors import DatabaseError
from tools.errors import ConfirmationNeeded, McpConfigError, ToolError

ROOT = Path(__file__).resolve().parents[1]
LOADED = "import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"


@pytest.mark.parametrize("module", ["agent.llm.engine", "agent.llm.local", "agent.llm.engine.model_thread"])
def test_loading_the_engine_loads_no_database_tools_or_bot(module: str) -> None:
    done = subprocess.run([sys.executable, "-c", LOADED.format(module=module)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True)
    loaded = json.loads(done.stdout)
    assert module in loaded
    assert [name for name in loaded if name.split(".")[0] in ("db", "tools", "bot")] == []


def test_every_packages_errors_derive_from_the_one_root() -> None:
    for branch in (AgentError, LLMError, ConfigError, EvalFileError, DatabaseError, ToolError, ConfirmationNeeded,
                   McpConfigError):
        assert issubclass(branch, BotError), branch
    assert BotError.__module__ == "core.errors"


def test_the_engines_readme_names_every_module_of_the_engine() -> None:
    engine = ROOT / "agent" / "llm" / "engine"
    readme = (engine / "README.md").read_text()
    modules = sorted(path.name for path in engine.glob("*.py") if path.name != "__init__.py")
    assert [name for name in modules if f"`{name}`" not in readme] == []
