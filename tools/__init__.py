"""Tools the model can call: the registry, and one module per tool."""

from __future__ import annotations

from db import Database
from tools.calculator import CALCULATOR
from tools.courses import CourseCatalog
from tools.registry import TOOL_TIMEOUT_SECONDS, Tool, ToolRegistry, ToolResult

__all__ = ["Tool", "ToolRegistry", "ToolResult", "build_registry"]


def build_registry(db: Database, timeout_seconds: float = TOOL_TIMEOUT_SECONDS,
                   free_text_course_names: bool = False) -> ToolRegistry:
    """Every tool the bot ships, registered in the order the prompt lists them."""
    catalog = CourseCatalog(db, free_text_names=free_text_course_names)
    return ToolRegistry.of([*catalog.tools(), CALCULATOR], timeout_seconds=timeout_seconds)
