"""A safe calculator: numbers, + - * / // % **, unary signs and parentheses, and nothing else.

The expression is parsed with `ast` and walked node by node; names, calls, attributes, subscripts and every
other construct are refused. Size limits keep `9**9**9` and friends from eating the machine.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Callable

from tools.errors import CalculationError
from tools.registry import Tool

MAX_EXPRESSION_LENGTH = 200
# Deep enough for any sum of many terms that fits MAX_EXPRESSION_LENGTH (a+b+c... nests one level per +).
MAX_DEPTH = 100
MAX_EXPONENT = 100
MAX_MAGNITUDE = 1e100

_BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[float], float]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def calculate(expression: str) -> int | float:
    """The value of an arithmetic expression; raises CalculationError for anything else."""
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("^", "**")
    if not text:
        raise CalculationError("the expression is empty")
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise CalculationError(f"the expression is longer than {MAX_EXPRESSION_LENGTH} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculationError(f"not an arithmetic expression: {expression!r}") from None
    return _check(_value(tree.body, 0))


def _value(node: ast.AST, depth: int) -> int | float:
    if depth > MAX_DEPTH:
        raise CalculationError("the expression is nested too deeply")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand, depth + 1))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _binary(node, depth)
    raise CalculationError(f"only numbers and + - * / // % ** ( ) are allowed, not {type(node).__name__}")


def _binary(node: ast.BinOp, depth: int) -> int | float:
    left, right = _value(node.left, depth + 1), _value(node.right, depth + 1)
    if isinstance(node.op, ast.Pow) and (abs(right) > MAX_EXPONENT or abs(left) > MAX_MAGNITUDE):
        raise CalculationError(f"exponents are limited to {MAX_EXPONENT}")
    try:
        return _check(_BINARY[type(node.op)](left, right))
    except ZeroDivisionError:
        raise CalculationError("division by zero") from None
    except (OverflowError, TypeError):
        raise CalculationError("the result is too large") from None


def _check(value: int | float | complex) -> int | float:
    if isinstance(value, complex):
        raise CalculationError("the result is not a real number")
    if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        raise CalculationError("the result is too large")
    return value


def format_number(value: int | float) -> str:
    """A result as people write it: 6 rather than 6.0, and no float noise (0.1+0.2 → 0.3)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:.12g}" if isinstance(value, float) else str(value)


async def calculator(expression: str) -> str:
    """Tool: compute an arithmetic expression."""
    return f"{expression.strip()} = {format_number(calculate(expression))}"


CALCULATOR = Tool(
    name="calculator",
    human_name="计算器",
    description=("Computes an arithmetic expression with numbers, + - * / // % ** and parentheses, "
                 "e.g. 3 * 2. 计算算术表达式。"),
    parameters={"type": "object",
                "properties": {"expression": {"type": "string", "minLength": 1, "maxLength": MAX_EXPRESSION_LENGTH,
                                              "description": "the arithmetic expression, e.g. (3 * 2) + 1"}},
                "required": ["expression"], "additionalProperties": False},
    function=calculator,
    progress="🧮 计算",
)
