"""The course database tool: loose lookups, the list, and validated admin changes on a real SQLite file."""

from __future__ import annotations

import json
import sqlite3

import pytest

from tools.courses import CourseCatalog
from tools.errors import CourseError

SEED = ["大模型技术实战", "机器学习实战", "深度学习实战", "AI数据分析"]


@pytest.fixture
def catalog(db) -> CourseCatalog:
    return CourseCatalog(db)


def rows(db_path) -> list[tuple]:
    """The courses table as another process would read it."""
    with sqlite3.connect(db_path) as conn:
        return conn.execute(
            "SELECT name, lessons, updates_per_week, hours_per_update FROM courses ORDER BY id").fetchall()


def found(output: str) -> dict:
    """The course a successful query returned (it is JSON; anything else is a failed match)."""
    return json.loads(output)


@pytest.mark.parametrize("name, expected", [
    ("大模型技术实战", {"课程名称": "大模型技术实战", "课时": 200, "每周更新次数": 3, "每次更新小时": 2}),
    ("机器学习实战", {"课程名称": "机器学习实战", "课时": 230, "每周更新次数": 2, "每次更新小时": 1.5}),
    ("深度学习实战", {"课程名称": "深度学习实战", "课时": 150, "每周更新次数": 1, "每次更新小时": 3}),
    ("AI数据分析", {"课程名称": "AI数据分析", "课时": 10, "每周更新次数": 1, "每次更新小时": 1}),
])
async def test_each_seed_course_by_its_exact_name(catalog, name, expected):
    assert found(await catalog.query(name)) == expected


@pytest.mark.parametrize("wording, course", [
    ("大模型技术实战课程", "大模型技术实战"),
    ("大模型实战", "大模型技术实战"),
    ("  大模型技术实战  ", "大模型技术实战"),
    ("《大模型技术实战》", "大模型技术实战"),
    ("请帮我查一下：我们的大模型技术实战课程目前一共上线了多少节？", "大模型技术实战"),
    ("大模型技朮实战", "大模型技术实战"),  # one character mistyped
    ("机器学习", "机器学习实战"),
    ("机器学习实战课", "机器学习实战"),
    ("深度学习实战 课程", "深度学习实战"),
    ("ai 数据分析", "AI数据分析"),
    ("AI数据 分析", "AI数据分析"),
    ("Ai数据分析", "AI数据分析"),
    ("ＡＩ数据分析", "AI数据分析"),  # full-width Latin letters
    ("ai数据分析课程", "AI数据分析"),
])
async def test_loose_wording_finds_the_course(catalog, wording, course):
    assert found(await catalog.query(wording))["课程名称"] == course


async def test_the_articles_question_gets_200(catalog):
    result = found(await catalog.query("大模型技术实战课程"))
    assert result["课时"] == 200


async def test_an_ambiguous_name_lists_the_candidates(catalog):
    output = await catalog.query("学习实战")
    assert "机器学习实战" in output and "深度学习实战" in output
    assert "大模型技术实战" not in output and "AI数据分析" not in output
    assert "课时" not in output  # no numbers: the model must not pick one course's data
    with pytest.raises(json.JSONDecodeError):
        json.loads(output)


async def test_nothing_matching_says_so_and_lists_the_closest(catalog):
    output = await catalog.query("量子计算")
    assert output.startswith("目前没有该课程信息")
    assert "量子计算" in output
    assert "最接近的课程有" in output
    assert any(name in output for name in SEED)


async def test_the_closest_names_are_the_similar_ones(catalog):
    output = await catalog.query("数据挖掘")
    assert output.startswith("目前没有该课程信息")
    assert "最接近的课程有：AI数据分析。" in output


async def test_a_course_sharing_only_a_suffix_is_not_a_match(catalog):
    # 强化学习实战 is not in the database; 机器学习实战 and 深度学习实战 only share 学习实战 with it.
    output = await catalog.query("强化学习实战")
    assert output.startswith("目前没有该课程信息")
    await catalog.remove("深度学习实战")
    output = await catalog.query("强化学习实战")
    assert output.startswith("目前没有该课程信息"), "another course's numbers were given for a missing course"
    assert "机器学习实战" in output  # still offered as the closest


async def test_course_list(catalog):
    lines = (await catalog.list_text()).splitlines()
    assert [json.loads(line) for line in lines] == [
        {"课程名称": "大模型技术实战", "课时": 200, "每周更新次数": 3, "每次更新小时": 2},
        {"课程名称": "机器学习实战", "课时": 230, "每周更新次数": 2, "每次更新小时": 1.5},
        {"课程名称": "深度学习实战", "课时": 150, "每周更新次数": 1, "每次更新小时": 3},
        {"课程名称": "AI数据分析", "课时": 10, "每周更新次数": 1, "每次更新小时": 1},
    ]


async def test_an_empty_catalog_says_so(catalog):
    for name in SEED:
        await catalog.remove(name)
    assert await catalog.list_text() == "课程数据库里目前没有课程。"
    output = await catalog.query("大模型技术实战")
    assert output.startswith("目前没有该课程信息") and "数据库里没有课程" in output


async def test_add_stores_the_course_and_it_can_be_queried(catalog, db_path):
    course = await catalog.add("  强化学习实战 ", "12", 2, "1.5")
    assert (course.name, course.lessons, course.updates_per_week, course.hours_per_update) == (
        "强化学习实战", 12, 2, 1.5)
    assert rows(db_path)[-1] == ("强化学习实战", 12, 2, 1.5)
    assert found(await catalog.query("强化学习实战课程"))["课时"] == 12
    # Now the two 学习实战 courses and the new one are all candidates for the vague name.
    assert "强化学习实战" in await catalog.query("学习实战")


@pytest.mark.parametrize("name, lessons, per_week, hours, says", [
    ("新课", -1, 1, 1, "between 0 and"),
    ("新课", "abc", 1, 1, "whole number"),
    ("新课", "1.5", 1, 1, "whole number"),
    ("新课", 1, "", 1, "whole number"),
    ("新课", 1, 1, "two", "a number"),
    ("新课", 1, 1, "nan", "between 0 and"),
    ("新课", 1, 1, "inf", "between 0 and"),
    ("新课", 10**9, 1, 1, "between 0 and"),
    ("新课", 1, 1, -0.5, "between 0 and"),
    ("", 1, 1, 1, "must not be empty"),
    ("   ", 1, 1, 1, "must not be empty"),
    ("\t\n", 1, 1, 1, "must not be empty"),
    ("——", 1, 1, 1, "must not be empty"),
    ("课" * 101, 1, 1, 1, "longer than"),
    ("大模型技术实战", 1, 1, 1, "already exists"),
    (" 大模型技术实战 ", 1, 1, 1, "already exists"),
    ("ai数据分析", 1, 1, 1, "already exists"),
])
async def test_add_refuses_bad_input_and_changes_nothing(catalog, db_path, name, lessons, per_week, hours, says):
    before = rows(db_path)
    with pytest.raises(CourseError, match=says):
        await catalog.add(name, lessons, per_week, hours)
    assert rows(db_path) == before


async def test_set_field_changes_one_field_of_one_course(catalog, db_path):
    course = await catalog.set_field("大模型技术实战", "lessons", "210")
    assert course.lessons == 210
    assert rows(db_path)[0] == ("大模型技术实战", 210, 3, 2.0)
    assert rows(db_path)[1:] == [("机器学习实战", 230, 2, 1.5), ("深度学习实战", 150, 1, 3.0), ("AI数据分析", 10, 1, 1.0)]
    assert found(await catalog.query("大模型实战"))["课时"] == 210


async def test_set_field_matches_the_name_case_insensitively(catalog, db_path):
    course = await catalog.set_field(" ai数据分析 ", "hours_per_update", 2.5)
    assert course.name == "AI数据分析" and course.hours_per_update == 2.5
    assert rows(db_path)[3] == ("AI数据分析", 10, 1, 2.5)


@pytest.mark.parametrize("name, field, value, says", [
    ("大模型技术实战", "lessons", -5, "between 0 and"),
    ("大模型技术实战", "lessons", "lots", "whole number"),
    ("大模型技术实战", "hours_per_update", "nan", "between 0 and"),
    ("大模型技术实战", "name", "x", "unknown field"),
    ("大模型技术实战", "id", 1, "unknown field"),
    ("大模型技术实战", "lessons = 0; DROP TABLE courses; --", 1, "unknown field"),
    ("大模型实战", "lessons", 1, "no course named"),  # admin changes need the exact name, not a loose one
    ("量子计算", "lessons", 1, "no course named"),
])
async def test_set_field_refuses_bad_input_and_changes_nothing(catalog, db_path, name, field, value, says):
    before = rows(db_path)
    with pytest.raises(CourseError, match=says):
        await catalog.set_field(name, field, value)
    assert rows(db_path) == before


async def test_remove(catalog, db_path):
    await catalog.remove("深度学习实战")
    assert [name for name, *_ in rows(db_path)] == ["大模型技术实战", "机器学习实战", "AI数据分析"]
    assert not (await catalog.query("深度学习实战")).startswith("{")
    with pytest.raises(CourseError, match="no course named"):
        await catalog.remove("深度学习实战")
    with pytest.raises(CourseError, match="no course named"):
        await catalog.remove("大模型实战")  # removal needs the exact name
    assert len(rows(db_path)) == 3


@pytest.mark.parametrize("name", ["'; DROP TABLE courses; --", "x' OR '1'='1", 'x" OR "1"="1', "a); DELETE FROM courses; --"])
async def test_sql_injection_names_are_stored_and_used_literally(catalog, db_path, name):
    await catalog.add(name, 7, 1, 1)
    assert rows(db_path)[:4] == [("大模型技术实战", 200, 3, 2.0), ("机器学习实战", 230, 2, 1.5),
                                 ("深度学习实战", 150, 1, 3.0), ("AI数据分析", 10, 1, 1.0)]
    assert rows(db_path)[4] == (name, 7, 1, 1.0)
    assert found(await catalog.query(name))["课程名称"] == name

    await catalog.set_field(name, "lessons", 99)
    assert [lessons for _, lessons, *_ in rows(db_path)] == [200, 230, 150, 10, 99]

    await catalog.remove(name)
    assert [n for n, *_ in rows(db_path)] == SEED


@pytest.mark.parametrize("name", ["'; DROP TABLE courses; --", "x' OR '1'='1"])
async def test_sql_injection_in_a_query_finds_nothing_and_harms_nothing(catalog, db_path, name):
    output = await catalog.query(name)
    assert output.startswith("目前没有该课程信息")
    with pytest.raises(CourseError):
        await catalog.remove(name)
    with pytest.raises(CourseError):
        await catalog.set_field(name, "lessons", 0)
    assert [n for n, *_ in rows(db_path)] == SEED
    assert [lessons for _, lessons, *_ in rows(db_path)] == [200, 230, 150, 10]


async def test_the_model_gets_read_only_tools(catalog):
    assert [t.name for t in catalog.tools()] == ["course_query", "course_list"]
