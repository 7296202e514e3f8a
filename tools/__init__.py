"""Tools the model can call: the registry, and one module per tool."""

from __future__ import annotations

from db import Database
from tools.calculator import CALCULATOR
from tools.courses import CourseCatalog
from tools.docs import DocsTools
from tools.registry import TOOL_TIMEOUT_SECONDS, Tool, ToolRegistry, ToolResult

__all__ = ["Tool", "ToolRegistry", "ToolResult", "build_registry"]


def build_registry(db: Database, timeout_seconds: float = TOOL_TIMEOUT_SECONDS,
                   free_text_course_names: bool = False, documents: DocsTools | None = None) -> ToolRegistry:
    """Every tool the bot ships, registered in the order the prompt lists them; the documents tools when
    `documents` is given (the program builds them from its settings: bot/program/services.py)."""
    catalog = CourseCatalog(db, free_text_names=free_text_course_names)
    extra = documents.tools() if documents is not None else []
    return ToolRegistry.of([*catalog.tools(), CALCULATOR, *extra], timeout_seconds=timeout_seconds)
