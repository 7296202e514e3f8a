"""The course database tool, from the original article, on SQLite.

The model gets two read-only tools: `course_query` (one course, matched loosely, since people write
`大模型技术实战课程` or `大模型实战`) and `course_list`. Changes (add, set a field, remove) are for admins only and
are never offered to the model.

At the start of each turn `course_query` narrows its `course_name` to an enum of the names in the database, so a
small model decoding under the turn's grammar picks a real course instead of inventing one. With
COURSE_NAMES_FREE_TEXT the operator allows any name instead (the names are then shown as examples): the tool's
loose matching and its "no such course" answer take over, at the price of names the model may make up.

A question that names courses (loosely, tools/mentions.py) links `course_query` to them: its grammar allows those
alone, and, where the question says what it asks (课时/lessons, 每周几次/times a week, 小时/hours), only those
fields (`fields`), so the observation holds the numbers that answer it and no others: a small model then cannot
answer "how many lessons" with the hours. `course_list` is left out of such a turn's grammar: the lookups of the
named courses hold all it could add.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Sequence

from db import Database
from tools.errors import CourseError
from tools.mentions import mentioned
from tools.registry import Linked, Tool

FIELDS = {"lessons": int, "updates_per_week": int, "hours_per_update": float}
FIELD_LABELS = {"lessons": "课时", "updates_per_week": "每周更新次数", "hours_per_update": "每次更新小时"}
# Words by which a question asks for a field, in Chinese and English (compared with the question casefolded).
FIELD_WORDS = {
    "lessons": ("课时", "节", "lesson"),
    "updates_per_week": ("每周", "一周", "两周", "几次", "week", "times", "how often"),
    "hours_per_update": ("小时", "时长", "hour", "how long"),
}
# At most one of each field's worth of items: a small model repeating "lessons" cannot fill its step with them.
FIELDS_PARAMETER = {"type": "array", "items": {"enum": list(FIELDS)}, "minItems": 1, "maxItems": len(FIELDS),
                    "description": "可选：只返回这些字段（lessons 课时, updates_per_week 每周更新次数, "
                                   "hours_per_update 每次更新小时）；不填则返回全部"}
# Words naming what the course tools are about (the first-step policy); the course names are added per turn.
SUBJECTS = ("课程", "课", "course", "lesson")
COURSE_NAME = {"type": "string", "minLength": 1, "maxLength": 200, "description": "课程名称，所需查询信息的课程名称"}
MAX_NAME_LENGTH = 100
MAX_FIELD_VALUE = 100_000
# Above 2/3, so names sharing only a suffix (强化学习实战 vs 机器学习实战: 0.67) do not match; typos (0.83) do.
MATCH_THRESHOLD = 0.7
# Words people add around a course name that are not part of it.
_FILLER = re.compile(r"(课程|课|course|class)$", re.IGNORECASE)
_NOT_WORD = re.compile(r"[\W_]+", re.UNICODE)


@dataclass(frozen=True)
class Course:
    """One course row."""

    name: str
    lessons: int
    updates_per_week: int
    hours_per_update: float

    def as_observation(self, fields: Sequence[str] = tuple(FIELDS)) -> dict[str, Any]:
        """The course as the model reads it (the article's field names), with `fields` only."""
        hours = self.hours_per_update
        values = {"lessons": self.lessons, "updates_per_week": self.updates_per_week,
                  "hours_per_update": int(hours) if float(hours).is_integer() else hours}
        return {"课程名称": self.name, **{FIELD_LABELS[field]: values[field] for field in FIELDS if field in fields}}


def normalize_name(name: str) -> str:
    """Fold width, case, spacing and punctuation, and drop trailing filler words like 课程."""
    folded = _NOT_WORD.sub("", unicodedata.normalize("NFKC", name).casefold())
    return _FILLER.sub("", folded) or folded


def similarity(query: str, name: str) -> float:
    """How well a normalized query fits a normalized name: 1 for containment, else difflib's ratio."""
    if not query or not name:
        return 0.0
    # Containment is a match only for queries of some substance: "a" is not a course name.
    if (query in name and len(query) >= 2) or name in query:
        return 1.0
    return difflib.SequenceMatcher(None, query, name).ratio()


class CourseCatalog:
    """Courses in the database: loose lookups for the model, validated changes for admins."""

    def __init__(self, db: Database, free_text_names: bool = False):
        self.db = db
        self.free_text_names = free_text_names

    async def all(self) -> list[Course]:
        """Every course, by name."""
        rows = await self.db.fetchall(
            "SELECT name, lessons, updates_per_week, hours_per_update FROM courses ORDER BY id")
        return [Course(*row) for row in rows]

    async def find(self, query: str) -> tuple[list[Course], list[Course]]:
        """(matches, closest): the best-fitting courses for `query`, or none and the closest names."""
        wanted = normalize_name(query)
        scored = sorted(((similarity(wanted, normalize_name(c.name)), c) for c in await self.all()),
                        key=lambda pair: -pair[0])
        best = scored[0][0] if scored else 0.0
        if best >= MATCH_THRESHOLD:
            return [c for score, c in scored if score == best], []
        return [], [c for score, c in scored[:3] if score > 0] or [c for _, c in scored[:3]]

    async def query(self, course_name: str, fields: Sequence[str] = tuple(FIELDS)) -> str:
        """Tool: the course's lessons, updates per week and hours per update (loosely matched), or `fields` only."""
        matches, closest = await self.find(course_name)
        if len(matches) == 1:
            return json.dumps(matches[0].as_observation(fields), ensure_ascii=False)
        if matches:
            names = "、".join(c.name for c in matches)
            return f"“{course_name}”可能指以下课程：{names}。请用完整的课程名称再查一次。"
        names = "、".join(c.name for c in closest) or "（数据库里没有课程）"
        return f"目前没有该课程信息：没有找到“{course_name}”。最接近的课程有：{names}。"

    async def list_text(self) -> str:
        """Tool: every course with its numbers, one per line."""
        courses = await self.all()
        if not courses:
            return "课程数据库里目前没有课程。"
        return "\n".join(json.dumps(c.as_observation(), ensure_ascii=False) for c in courses)

    async def add(self, name: str, lessons: Any, updates_per_week: Any, hours_per_update: Any) -> Course:
        """Admin: add a course; refuses empty or duplicate names and negative or non-numeric values."""
        course = Course(clean_name(name), *(parse_field(f, v) for f, v in
                        zip(FIELDS, (lessons, updates_per_week, hours_per_update))))
        async with self.db.transaction() as conn:
            if await _exists(conn, course.name):
                raise CourseError(f"course {course.name!r} already exists")
            if (twin := await _lookalike(conn, course.name)) is not None:
                raise CourseError(f"course {course.name!r} already exists as {twin!r}: lookups could not tell "
                                  "them apart")
            await conn.execute(
                "INSERT INTO courses (name, lessons, updates_per_week, hours_per_update) VALUES (?, ?, ?, ?)",
                (course.name, course.lessons, course.updates_per_week, course.hours_per_update))
        return course

    async def set_field(self, name: str, field: str, value: Any) -> Course:
        """Admin: change one field of a course named exactly (case-insensitively) `name`."""
        if field not in FIELDS:
            raise CourseError(f"unknown field {field!r}; fields are: {', '.join(FIELDS)}")
        parsed = parse_field(field, value)
        async with self.db.transaction() as conn:
            # `field` is one of FIELDS' keys (checked above), so the column name is never user text.
            cursor = await conn.execute(
                f"UPDATE courses SET {field} = ?, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') "
                "WHERE name = ? COLLATE NOCASE", (parsed, name.strip()))
            if cursor.rowcount == 0:
                raise CourseError(f"no course named {name.strip()!r}")
        return await self._get(name)

    async def remove(self, name: str) -> None:
        """Admin: delete the course named exactly (case-insensitively) `name`."""
        async with self.db.transaction() as conn:
            cursor = await conn.execute("DELETE FROM courses WHERE name = ? COLLATE NOCASE", (name.strip(),))
            if cursor.rowcount == 0:
                raise CourseError(f"no course named {name.strip()!r}")

    async def _get(self, name: str) -> Course:
        row = await self.db.fetchone(
            "SELECT name, lessons, updates_per_week, hours_per_update FROM courses WHERE name = ? COLLATE NOCASE",
            (name.strip(),))
        if row is None:
            raise CourseError(f"no course named {name.strip()!r}")
        return Course(*row)

    def tools(self) -> list[Tool]:
        """The read-only tools the model may use."""
        return [
            Tool(
                name="course_query",
                human_name="课程信息数据库",
                description=("课程信息数据库存储有各课程的详细信息，包括目前的上线课时，每周更新次数以及每次更新的小时数。"
                             "通过输入课程名称，可以返回该课程的详细信息。"),
                parameters=query_schema(COURSE_NAME),
                function=self.query,
                progress="🔎 查询课程数据库",
                subjects=SUBJECTS,
                narrow=self.narrowed,
                link=self.linked,
            ),
            Tool(
                name="course_list",
                human_name="课程列表",
                description="列出课程信息数据库中的所有课程及其课时、每周更新次数和每次更新小时数。不需要参数。",
                parameters={"type": "object", "properties": {}, "additionalProperties": False},
                function=self.list_text,
                progress="📚 列出所有课程",
                subjects=SUBJECTS,
                narrow=self.with_course_names,
                link=self.withheld,
            ),
        ]

    async def narrowed(self, tool: Tool) -> Tool:
        """`course_query` for one turn: `course_name` is one of the names in the database (or, with free-text
        names, any name, the known ones given as examples); its subjects include every course name."""
        names = [course.name for course in await self.all()]
        if not names:
            return tool  # nothing to choose from: the declared schema, and the tool says the database is empty
        if self.free_text_names:
            field = {**COURSE_NAME, "examples": names}
        else:
            field = {"type": "string", "enum": names, "description": COURSE_NAME["description"]}
        return dataclasses.replace(tool, parameters=query_schema(field), subjects=(*tool.subjects, *names))

    async def linked(self, tool: Tool, question: str) -> Linked | None:
        """`course_query` held to the courses `question` names (matched as loosely as lookups are) and to the
        fields it asks for; None when it names none."""
        named = await self.named_in(question)
        if not named:
            return None
        name = {"type": "string", "enum": named, "description": COURSE_NAME["description"]}
        asked = asked_fields(question)
        schema = query_schema(name, {**FIELDS_PARAMETER, "const": asked}) if asked else query_schema(name)
        return Linked(dataclasses.replace(tool, parameters=schema), tuple(named))

    async def withheld(self, tool: Tool, question: str) -> Linked | None:
        """`course_list` for a question naming courses: left out (their lookups hold all it could add)."""
        named = await self.named_in(question)
        return Linked(None, tuple(named)) if named else None

    async def named_in(self, question: str) -> list[str]:
        """The courses `question` names, matched as loosely as lookups are."""
        return mentioned(question, [course.name for course in await self.all()], normalize_name, MATCH_THRESHOLD)

    async def with_course_names(self, tool: Tool) -> Tool:
        """`course_list` for one turn: its subjects include every course name."""
        names = tuple(course.name for course in await self.all())
        return dataclasses.replace(tool, subjects=(*tool.subjects, *names))


def query_schema(course_name: dict[str, Any], fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """`course_query`'s parameters: `course_name` as given, and `fields` as given (then required: a question held
    the call to them) or optional."""
    return {"type": "object", "properties": {"course_name": course_name, "fields": fields or FIELDS_PARAMETER},
            "required": ["course_name", "fields"] if fields else ["course_name"], "additionalProperties": False}


def asked_fields(question: str) -> list[str]:
    """The fields a question asks for by its words (课时, times a week, hours…), in the table's order."""
    folded = unicodedata.normalize("NFKC", question).casefold()
    return [field for field in FIELDS if any(word in folded for word in FIELD_WORDS[field])]


def clean_name(name: str) -> str:
    """A course name as stored: trimmed, NFC, non-empty, not too long."""
    cleaned = unicodedata.normalize("NFC", str(name)).strip()
    if not cleaned or not any(ch.isalnum() for ch in cleaned):
        raise CourseError("course name must not be empty")
    if len(cleaned) > MAX_NAME_LENGTH:
        raise CourseError(f"course name is longer than {MAX_NAME_LENGTH} characters")
    return cleaned


def parse_field(field: str, value: Any) -> int | float:
    """A field value as stored: a whole number for counts, a number for hours; never negative or absurd."""
    kind = FIELDS[field]
    try:
        number = kind(str(value).strip())
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise CourseError(f"{field} must be {noun}, got {value!r}") from None
    if not math.isfinite(number) or number < 0 or number > MAX_FIELD_VALUE:
        raise CourseError(f"{field} must be between 0 and {MAX_FIELD_VALUE}, got {value!r}")
    return number


async def _exists(conn: Any, name: str) -> bool:
    async with conn.execute("SELECT 1 FROM courses WHERE name = ? COLLATE NOCASE", (name,)) as cursor:
        return await cursor.fetchone() is not None


async def _lookalike(conn: Any, name: str) -> str | None:
    """An existing course whose name is `name` once width, case, punctuation and a trailing 课程 are folded."""
    wanted = normalize_name(name)
    async with conn.execute("SELECT name FROM courses") as cursor:
        return next((other for (other,) in await cursor.fetchall() if normalize_name(other) == wanted), None)
