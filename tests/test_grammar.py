"""The step grammars (agent/grammar.py), checked token by token with llguidance on a real tokenizer (SmolLM2's).

No model weights: the tokenizer alone decides what the grammar lets through, which is what the masks enforce.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from agent.errors import ModelLoadError
from agent.grammar import (Grammar, GrammarLimits, capped_schema, native_grammar, react_final_grammar,
                           react_step_grammar)
from agent.llm.engine.grammar_masks import GrammarEngine, unpack_bitmask
from agent.llm.engine.loading import ModelSource, check_renders_tools
from tools.calculator import CALCULATOR
from tools.courses import CourseCatalog, query_schema

REPO = Path(__file__).resolve().parents[1]
GGUF = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
COURSES = ["大模型技术实战", "机器学习实战", "深度学习实战", "AI数据分析"]


@pytest.fixture(scope="module")
def tokenizer():
    """SmolLM2's tokenizer, read from the offline GGUF file."""
    if not GGUF.is_file():
        pytest.fail(f"{GGUF} is missing: run scripts/fetch_assets.sh (scripts/test.sh does)")
    return AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)


@pytest.fixture(scope="module")
def engine(tokenizer):
    return GrammarEngine(tokenizer)


@pytest.fixture(scope="module")
def tools():
    """The shipped tools, course_query narrowed to the seeded courses as a turn sees it."""
    query, listing = CourseCatalog(None).tools()
    narrowed = dataclasses.replace(query, parameters=query_schema({"type": "string", "enum": COURSES}))
    return [narrowed, listing, CALCULATOR]


def accepts(engine: GrammarEngine, tokenizer, grammar: Grammar, text: str) -> bool:
    """Whether `text` then the end-of-turn token is a complete reply under `grammar`, fed token by token."""
    row = engine.row(grammar)
    for token in tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]:
        row.advance(token)
        if not row.active:
            return False
    return row.matcher.is_stopped()


def step(tool: str, arguments: dict) -> str:
    return f"Thought: 查一下。\nAction: {tool}\nAction Input: {json.dumps(arguments, ensure_ascii=False)}\n"


@pytest.mark.parametrize("text", [
    step("course_query", {"course_name": "大模型技术实战"}),
    step("course_list", {}),
    step("calculator", {"expression": "3 * 2"}),
    "Thought: I now know the final answer\nFinal Answer: 大模型技术实战一共200节。\n\nThat is all.",
])
def test_a_well_formed_step_is_accepted_to_the_end(engine, tokenizer, tools, text):
    assert accepts(engine, tokenizer, react_step_grammar(tools, continuing=False), text)


@pytest.mark.parametrize("text", [
    "I now know the answer\n\nEnd!",  # no Thought
    "Thought: I now know the answer",  # a Thought, then nothing
    "Thought: x\nAction: The action to take\n",  # the prompt's placeholder as a tool
    step("course_search", {"course_name": "大模型技术实战"}),  # no such tool
    step("course_query", {"course_name": "大模型实战"}),  # not a course in the database
    step("course_query", {}),  # the required argument missing
    step("course_query", {"course_name": "大模型技术实战", "extra": 1}),  # an argument the schema does not have
    step("calculator", {"expression": "1+" * 150 + "1"}),  # a free-text string past the length cap
    "Thought: x\nAction: course_list\nAction Input: {}\nObservation: made up",  # nothing after the input
])
def test_replies_that_break_the_format_cannot_be_generated(engine, tokenizer, tools, text):
    assert not accepts(engine, tokenizer, react_step_grammar(tools, continuing=False), text)


def test_a_continued_step_starts_after_the_traces_thought(engine, tokenizer, tools):
    grammar = react_step_grammar(tools, continuing=True)
    assert accepts(engine, tokenizer, grammar, " 我现在知道了。\nFinal Answer: 200节")
    assert not accepts(engine, tokenizer, grammar, "Thought: again\nFinal Answer: 200节")


def test_a_required_tool_call_leaves_no_final_answer(engine, tokenizer, tools):
    grammar = react_step_grammar(tools, continuing=False, tool_required=True)
    assert accepts(engine, tokenizer, grammar, step("course_query", {"course_name": "AI数据分析"}))
    assert not accepts(engine, tokenizer, grammar, "Thought: x\nFinal Answer: 200")


def test_the_thought_is_one_line_of_bounded_length(engine, tokenizer, tools):
    grammar = react_step_grammar(tools, continuing=False, limits=GrammarLimits(thought_max_tokens=4))
    assert accepts(engine, tokenizer, grammar, "Thought: ok\nFinal Answer: 1")
    assert not accepts(engine, tokenizer, grammar, "Thought: one two three four five six seven\nFinal Answer: 1")
    assert not accepts(engine, tokenizer, grammar, "Thought: line one\nline two\nFinal Answer: 1")


def test_a_thought_cannot_hold_the_stop_string_and_an_answer_cannot_be_blank(engine, tokenizer, tools):
    """Either would leave a step that does not parse: the reply is cut at "Observation:", and a blank Final Answer
    is no answer."""
    grammar = react_step_grammar(tools, continuing=False)
    assert not accepts(engine, tokenizer, grammar, "Thought: x Observation: y\nFinal Answer: 1")
    assert not accepts(engine, tokenizer, grammar, "Thought: x\nFinal Answer: \n")
    assert not accepts(engine, tokenizer, grammar, "Thought: x\nFinal Answer: Observation: 1")
    assert accepts(engine, tokenizer, grammar, "Thought: x\nFinal Answer: 1\n\n(from the course table)")


def test_tool_arguments_are_compact_json(engine, tokenizer, tools):
    """JSON's free whitespace let a tiny model fill its step with newlines inside `{}`: one line, Qwen's spacing."""
    grammar = react_step_grammar(tools, continuing=False)
    assert accepts(engine, tokenizer, grammar, 'Thought: x\nAction: course_list\nAction Input: {}\n')
    assert accepts(engine, tokenizer, grammar, step("course_query", {"course_name": "AI数据分析"}))
    assert not accepts(engine, tokenizer, grammar, 'Thought: x\nAction: course_list\nAction Input: {\n \n}\n')
    assert not accepts(engine, tokenizer, grammar,
                       'Thought: x\nAction: course_query\nAction Input: {"course_name":"AI数据分析"}\n')


def test_the_answer_after_a_final_request_is_free_text(engine, tokenizer):
    assert accepts(engine, tokenizer, react_final_grammar(), " 一共200节。")
    assert not accepts(engine, tokenizer, react_final_grammar(), "")


def test_native_replies_are_text_or_valid_tool_calls(engine, tokenizer, tools):
    grammar = native_grammar(tools)
    call = '<tool_call>\n{"name": "course_query", "arguments": {"course_name": "机器学习实战"}}\n</tool_call>'
    assert accepts(engine, tokenizer, grammar, "大模型技术实战一共200节。")
    assert accepts(engine, tokenizer, grammar, call)
    assert accepts(engine, tokenizer, grammar, "<think>\nlook it up\n</think>\n\n" + call)
    assert not accepts(engine, tokenizer, grammar, call.replace("course_query", "course_search"))
    assert not accepts(engine, tokenizer, grammar, call.replace("机器学习实战", "强化学习实战"))
    assert not accepts(engine, tokenizer, native_grammar(tools, tool_required=True), "大模型技术实战一共200节。")


def test_free_text_strings_get_a_length_cap_and_bounded_ones_keep_theirs():
    schema = {"type": "object", "properties": {
        "free": {"type": "string"}, "short": {"type": "string", "maxLength": 5},
        "long": {"type": "string", "maxLength": 500},
        "choice": {"type": "string", "enum": ["a"]}, "items": {"type": "array", "items": {"type": "string"}}}}
    capped = capped_schema(schema, 50)
    assert capped["properties"]["free"]["maxLength"] == 50
    assert capped["properties"]["short"]["maxLength"] == 5
    assert capped["properties"]["long"]["maxLength"] == 50
    assert "maxLength" not in capped["properties"]["choice"]
    assert capped["properties"]["items"]["items"]["maxLength"] == 50
    assert "maxLength" not in schema["properties"]["free"]  # the tool's own schema is left alone


def test_a_step_grammar_needs_a_tool():
    with pytest.raises(ValueError):
        react_step_grammar([], continuing=False)


def test_masks_unpack_to_exactly_the_tokens_llguidance_allows(engine, tokenizer, tools):
    row = engine.row(react_step_grammar(tools, continuing=True))
    for token in tokenizer.encode(" x\nAction:", add_special_tokens=False):
        row.advance(token)
    bitmask = torch.zeros((1, (engine.vocab_size + 31) // 32), dtype=torch.int32)
    engine.fill_masks([row], bitmask)
    allowed = unpack_bitmask(bitmask, engine.vocab_size + 7)[0]
    assert allowed.shape[0] == engine.vocab_size + 7 and not allowed[engine.vocab_size:].any()
    allowed_ids = allowed.nonzero().flatten().tolist()
    names = (" course_query", " course_list", " calculator")
    assert allowed_ids and all(any(name.startswith(tokenizer.decode([t])) for name in names) for t in allowed_ids)
    assert all(row.matcher.deep_copy().consume_token(t) for t in allowed_ids)
    refused = [t for t in range(0, engine.vocab_size, 97) if t not in allowed_ids]  # a sample, to keep it quick
    assert not any(row.matcher.deep_copy().consume_token(t) for t in refused)


def test_native_mode_is_refused_when_the_chat_template_ignores_tools(tokenizer):
    with pytest.raises(ModelLoadError) as refused:
        check_renders_tools(ModelSource("SmolLM2.gguf", "."), tokenizer)
    assert str(refused.value).startswith("MODEL SmolLM2.gguf: its chat template ignores tools")
    assert "\n" not in str(refused.value)


def test_native_mode_is_allowed_when_the_chat_template_renders_tools(tokenizer):
    renders = copy.deepcopy(tokenizer)
    renders.chat_template = ("{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"
                             "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    check_renders_tools(ModelSource("qwen-like", "."), renders)  # does not raise


def fed(engine: GrammarEngine, tokenizer, grammar: Grammar, text: str):
    """A row's grammar after the reply so far, `text`."""
    row = engine.row(grammar)
    for token in tokenizer.encode(text, add_special_tokens=False):
        row.advance(token)
    assert row.active, row.failure
    return row


def test_what_a_row_may_check_ahead_is_what_the_grammar_forces_next(engine, tokenizer, tools):
    # After the tool's name, the step can only go on with its argument line's opening.
    row = fed(engine, tokenizer, react_step_grammar(tools, continuing=False),
              "Thought: 查一下。\nAction: course_list")
    forced = row.allowed_ahead([])
    assert forced and tokenizer.decode(forced).startswith("\nAction Input:")


def test_a_guess_is_cut_where_the_grammar_would_refuse_it(engine, tokenizer, tools):
    row = fed(engine, tokenizer, react_step_grammar(tools, continuing=False), "Thought: ")
    fits = tokenizer.encode("查一下。", add_special_tokens=False)
    refused = tokenizer.encode("\nObservation: 200", add_special_tokens=False)  # no Action after the Thought
    assert row.allowed_ahead(fits + refused) == fits + refused[:1]  # the newline would end the Thought: still allowed
    assert row.allowed_ahead([]) == []
