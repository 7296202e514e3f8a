"""The layout the README draws: imports run one way, and bot/ is two halves with one door between them.

bot/telegram/ (the adapter) may use bot/program/ (settings, wiring); the program loads the adapter only where
`qwenbot run` builds the application. Inside the adapter, the intake is started by the application and called
back by nobody: the dispatcher attaches each update's journal key itself.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imports(path: Path) -> list[tuple[str, str | None]]:
    """(module imported, the function it is imported in, or None at module level) for every import in `path`."""
    found: list[tuple[str, str | None]] = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if isinstance(child, ast.ImportFrom) and child.module:
                found.extend((f"{child.module}.{alias.name}", function) for alias in child.names)
            elif isinstance(child, ast.Import):
                found.extend((alias.name, function) for alias in child.names)
            visit(child, function)

    visit(ast.parse(path.read_text(encoding="utf-8")), None)
    return found


def importers(folder: str, prefix: str) -> dict[str, list[str | None]]:
    """Which files under `folder` import a module under `prefix`, and in which functions."""
    result: dict[str, list[str | None]] = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        hits = [function for module, function in imports(path) if module == prefix or module.startswith(prefix + ".")]
        if hits:
            result[path.relative_to(ROOT).as_posix()] = hits
    return result


def test_the_layers_below_bot_never_import_it():
    for folder in ("agent", "tools", "db"):
        assert importers(folder, "bot") == {}, folder


def test_the_program_loads_the_telegram_adapter_only_where_qwenbot_run_builds_it():
    assert importers("bot/program", "bot.telegram") == {"bot/program/cli.py": ["run_command"]}


def test_only_the_application_starts_the_intake_and_nothing_calls_back_into_it():
    assert list(importers("bot", "bot.telegram.intake")) == ["bot/telegram/app.py"]


def test_the_terminal_commands_do_not_load_python_telegram_bot():
    code = "import sys, bot.program.cli; print(sorted(m for m in sys.modules if m.split('.')[0] == 'telegram'))"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
