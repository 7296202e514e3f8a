"""`qwenbot eval`: reading question sets, scoring answers, classing failures, and the command end to end."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agent.errors import LLMError, LLMTimeout
from agent.llm.scripted import Request, ScriptedLLM
from agent.loop import Agent
from agent.memory import Memory
from bot.program.evaluation import EvalCase, EvalFileError, evaluate, load_cases, summary
from tools.settings import ToolSettings

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "questions.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_the_shipped_question_set_loads_and_has_at_least_30_questions():
    cases = load_cases(REPO / "evals" / "courses.jsonl")
    assert len(cases) >= 30
    assert any(re.search(r"[a-zA-Z]{4}", case.question) for case in cases)  # English too
    assert sum(bool(case.expect_any) for case in cases) >= 3  # unknown courses


@pytest.mark.parametrize("line, message", [
    ("not json", "line 2: not JSON"),
    ('{"question": "x", "expect": ["1"]}', 'line 2: expected {"q": "question", "expect": [...]}'),
    ('{"q": "x", "expect": ["1"], "tool": "calc"}', "line 2: unknown field(s) tool"),
    ('{"q": "x", "expect": [1]}', "line 2: expect must be a list of non-empty strings"),
    ('{"q": "x"}', "line 2: give expect or expect_any"),
])
def test_a_bad_line_is_refused_with_its_number(tmp_path, line, message):
    path = write(tmp_path, '{"q": "fine", "expect": ["1"]}', line)
    with pytest.raises(EvalFileError) as refused:
        load_cases(path)
    assert str(refused.value).startswith(f"{path}, {message}")


def test_an_empty_file_is_refused(tmp_path):
    with pytest.raises(EvalFileError, match="holds no questions"):
        load_cases(write(tmp_path, "", "  "))


def test_answers_are_matched_ignoring_case_and_width():
    case = EvalCase("q", expect=("200",), expect_any=("节", "lessons"), expect_none=("230",))
    assert case.accepts("２００ LESSONS")
    assert not case.accepts("200")  # none of expect_any
    assert not case.accepts("200节, or 230节")  # one of expect_none


LOOKUP = 'Thought: 查一下。\nAction: course_query\nAction Input: {{"course_name": "{}"}}\nObservation:'


def scripted_model(request: Request) -> str:
    """A model whose every reply depends only on its request, so concurrent questions get the same replies."""
    question, continuing = request.messages[1]["content"], request.messages[-1]["role"] == "assistant"
    trace = request.last_content if continuing else ""
    if "timeout" in question:
        raise LLMTimeout("the turn took too long")
    if "broken" in question:
        raise LLMError("the model server failed")
    if "rambling" in question:
        return "I now know the answer\n\nEnd!"
    if "unknown" in question:
        return " ok\nFinal Answer: none" if continuing else "Thought: x\nAction: course_search\nAction Input: {}\n"
    if "bad arguments" in question:
        return " ok\nFinal Answer: none" if continuing else 'Thought: x\nAction: course_query\nAction Input: {"nam": 1}\n'
    if "memory" in question:
        return "Thought: I know it\nFinal Answer: 100"
    if "wrong" in question:  # a number it observed, but not the one asked for
        return " ok\nFinal Answer: 3 lessons" if continuing else LOOKUP.format("大模型技术实战")
    if "guess" in question:  # a number it never observed: turned back once, then the honest answer
        return " ok\nFinal Answer: about 100" if continuing else LOOKUP.format("大模型技术实战")
    if continuing:
        lessons = re.search(r'"课时": (\d+)', trace).group(1)
        return f" I now know the final answer\nFinal Answer: {lessons} lessons"
    return LOOKUP.format("大模型技术实战")


async def test_every_question_runs_at_once_in_a_fresh_session_and_failures_get_their_class(db, registry):
    kinds = ["right", "rambling", "unknown", "bad arguments", "memory", "wrong", "guess", "broken", "timeout"]
    cases = [EvalCase(f"{kind}: 大模型技术实战多少节?", expect=("200",)) for kind in kinds]
    llm = ScriptedLLM([scripted_model] * 40)
    agent = Agent(llm, registry, ToolSettings(db, registry), Memory(db))

    report = await evaluate(agent, cases)

    classes = {result.case.question.split(":")[0]: result.failure for result in report.results}
    assert classes == {"right": None, "rambling": "format", "unknown": "unknown_tool",
                       "bad arguments": "bad_arguments", "memory": "no_tool_call", "wrong": "wrong_answer",
                       "guess": "honest_unknown", "broken": "error", "timeout": "timeout"}
    assert report.passed == 1 and report.results[0].answer == "200 lessons"
    assert report.format_steps() == 2  # the rambling question's two replies
    sessions = await db.fetchall("SELECT DISTINCT session_id FROM turns")
    assert len(sessions) == len(cases)  # one fresh session each (failed turns are stored too)
    lines = summary(report, "q.jsonl")
    assert "score: 1/9 (11%)" in lines
    assert ("failures: timeout 1, error 1, format 1, garbage 0, ungrounded 0, unknown tool 1, bad arguments 1, "
            "no tool call 1, honest unknown 1, tool right but answer wrong 1") in lines


def qwenbot_eval(tmp_path: Path, questions: Path, *args: str, replies=()) -> subprocess.CompletedProcess:
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(list(replies), ensure_ascii=False), encoding="utf-8")
    env = {**os.environ, "LLM_BACKEND": "scripted", "SCRIPTED_REPLIES_PATH": str(script),
           "DATABASE_PATH": str(tmp_path / "bot.sqlite3"), "LOG_LEVEL": "WARNING", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "bot.program.cli", "eval", str(questions), *args], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)


def test_qwenbot_eval_prints_the_score_writes_the_report_and_leaves_the_bots_database_alone(tmp_path):
    questions = write(tmp_path, '{"q": "大模型技术实战多少节？", "expect": ["200"]}')
    replies = [LOOKUP.format("大模型技术实战"), " 我知道了\nFinal Answer: 一共200节。"]
    subprocess.run([sys.executable, "-m", "bot.program.cli", "migrate"], env={**os.environ, "PYTHONPATH": str(REPO),
                   "DATABASE_PATH": str(tmp_path / "bot.sqlite3")}, cwd=tmp_path, check=True, capture_output=True)

    done = qwenbot_eval(tmp_path, questions, "--report", str(tmp_path / "report.json"), replies=replies)

    assert done.returncode == 0, done.stderr
    assert "✓ 大模型技术实战多少节？ → 一共200节。" in done.stdout
    assert "score: 1/1 (100%)" in done.stdout
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert report["passed"] == 1 and report["failures"]["format"] == 0 and report["backend"] == "scripted"
    assert report["questions"][0]["steps"][0]["action"] == "course_query"
    with sqlite3.connect(tmp_path / "bot.sqlite3") as bot_db:
        assert bot_db.execute("SELECT count(*) FROM turns").fetchone() == (0,)  # the run used a copy


def test_qwenbot_eval_with_a_bad_file_fails_in_one_line(tmp_path):
    done = qwenbot_eval(tmp_path, write(tmp_path, '{"q": "x"}'))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("qwenbot: ") and "line 1" in done.stderr
    assert "Traceback" not in done.stderr


async def test_an_apology_never_passes_even_when_it_holds_an_expected_word(db, registry):
    """The unknown-course questions accept "not "; the format apology says "could not": it is still no answer."""
    cases = [EvalCase("rambling: How many lessons does the Rust course have?", expect_any=("not ",)),
             EvalCase("right: Does the Rust course exist?", expect_any=("not ", "lessons"))]
    agent = Agent(ScriptedLLM([scripted_model] * 10), registry, ToolSettings(db, registry), Memory(db))

    report = await evaluate(agent, cases)

    rambling, right = report.results
    assert rambling.answer.startswith("Sorry, I could not") and not rambling.passed
    assert rambling.failure == "format"
    assert right.passed


# A strong model: follows the format, looks up first, answers right, and writes its numbers its own way.
STRONG = {  # question → (the calls it makes, in order, as "tool|json"; its final answer)
    "大模型技术实战每次更新几个小时？": (['course_query|{"course_name": "大模型技术实战"}'], "每次更新2.0小时。"),
    "How many hours is each update of 机器学习实战?": (['course_query|{"course_name": "机器学习实战"}'],
                                                   "Each update is 1.50 hours."),
    "How many lessons does 大模型技术实战 have?": (['course_query|{"course_name": "大模型技术实战"}'], "200.0 lessons."),
    "从2024-03-01起，大模型技术实战每周更新几次？": (['course_query|{"course_name": "大模型技术实战"}'],
                                            "自2024年3月1日起，每周更新3次。"),
    "大模型技术实战每周一共更新多少小时？": (['course_query|{"course_name": "大模型技术实战"}',
                                  'calculator|{"expression": "3*2"}'], "每周共更新6小时。"),
    "How many hours a week does 大模型技术实战 get?": (['course_query|{"course_name": "大模型技术实战"}'],
                                                "3 updates × 2 hours = 6 hours a week."),
    "机器学习实战每周更新几次？": (['course_query|{"course_name": "机器学习实战"}'], "每周更新两次。"),
}


def strong_model(request: Request) -> str:
    """The strong model's reply at whichever step its question is (the calls made so far are the observations)."""
    question = next(q for q in STRONG if q in request.messages[1]["content"])
    calls, answer = STRONG[question]
    trace = request.last_content if request.messages[-1]["role"] == "assistant" else ""
    done = trace.count("Observation:")
    if done < len(calls):
        tool, arguments = calls[done].split("|", 1)
        return f"Thought: I should look it up\nAction: {tool}\nAction Input: {arguments}\nObservation:"
    return f" I now know the final answer\nFinal Answer: {answer}"


async def test_a_strong_model_scores_everything_the_safety_nets_never_reject_a_right_grounded_answer(db, registry):
    expected = {"每次更新2.0小时": "2", "1.50": "1.5", "200.0": "200", "2024年3月1日": "3", "6小时": "6",
                "6 hours": "6", "两次": "2"}
    cases = [EvalCase(q, expect=(next(v for k, v in expected.items() if k in a),), kind="lookup")
             for q, (_, a) in STRONG.items()]
    agent = Agent(ScriptedLLM([strong_model] * 40), registry, ToolSettings(db, registry), Memory(db))

    report = await evaluate(agent, cases)

    assert [(r.case.question, r.answer, r.failure) for r in report.results if not r.passed] == []
    assert [r.answer for r in report.results] == [answer for _, answer in STRONG.values()]  # delivered as written
    assert report.failures()["ungrounded"] == report.failures()["garbage"] == 0
