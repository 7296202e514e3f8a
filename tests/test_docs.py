"""The README and the guides in docs/ stay true: links lead somewhere, commands parse, the layout names every folder.

Only what can be checked offline: a link's file and heading exist, a `qwenbot` command in a code block is one the
command line takes, a script a code block runs is there, the doctor example counts the migrations that ship.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from bot.program.cli import build_parser
from db.migrate import MIGRATIONS_FOLDER, discover

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "SECURITY.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


def page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text(encoding="utf-8")), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:: not checked offline
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page_id(page)}: {target} leads nowhere"
        if anchor:
            assert anchor in anchors(linked), f"{page_id(page)}: {target} names no heading of {path or 'itself'}"


def commands(page: Path) -> list[list[str]]:
    """The command lines of the page's code blocks (continuations joined, comments and env assignments dropped)."""
    found = []
    for block in FENCE.findall(page.read_text(encoding="utf-8")):
        for line in block.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue  # not shell: JSON, Python, a chat transcript
            while words and re.match(r"^[A-Z_]+=", words[0]):
                words = words[1:]
            if words:
                found.append(words)
    return found


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_qwenbot_command_and_script_in_a_code_block_is_one_that_exists(page):
    for words in commands(page):
        if words[0].endswith("qwenbot"):
            try:
                build_parser().parse_args(words[1:])
            except SystemExit:
                pytest.fail(f"{page_id(page)}: qwenbot does not take {' '.join(words)}")
        elif words[0].startswith("./scripts/"):
            assert (ROOT / words[0]).is_file(), f"{page_id(page)}: no {words[0]}"


def test_the_doctor_example_counts_the_migrations_that_ship():
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    (count,) = re.findall(r"\(migrated, (\d+) migrations; writable\)", text)
    assert int(count) == len(discover(MIGRATIONS_FOLDER))


def test_the_readme_layout_names_every_folder_of_the_project():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## Layout"):]
    named = set(re.findall(r"^\| `([\w./-]+)/`", table, re.MULTILINE))
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    folders = {path.split("/")[0] for path in tracked.splitlines() if "/" in path and not path.startswith(".")}
    folders |= {str(path.parent.relative_to(ROOT)) for path in (ROOT / "bot").glob("*/__init__.py")}
    # A folder is named itself, or through the subfolders it is split into (bot/telegram/, bot/program/).
    assert {folder for folder in folders if folder not in named
            and not any(name.startswith(folder + "/") for name in named)} == set()
