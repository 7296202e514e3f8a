"""Document files for the documents tests: the committed corpus (evals/docs/corpus/), a scanned PDF, and files
made on the spot (a zip bomb dressed as .docx, HTML, text)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "evals" / "docs" / "corpus"
SCANNED_PDF = ROOT / "tests" / "data" / "docs" / "scanned.pdf"
GUIDE_TITLE = "课程研发团队工作指南"
GPU_HEADING = f"{GUIDE_TITLE} › 开发环境配置 › 获取 GPU 服务器访问权限"

HANDBOOK_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>On-call handbook</title><style>body { color: red }</style>
<script>alert("never indexed")</script></head>
<body><h1>On-call handbook</h1><p>Who answers the pager, and how.</p>
<h2>Escalation</h2><p>Page the <b>secondary</b> after 15 minutes without an acknowledgement.</p>
<h2>Handover</h2><ul><li>Write the handover note in the incident channel.</li><li>Hand over at 10:00.</li></ul>
</body></html>"""

EXPENSES_TEXT = """Expense policy

Claims are due by the 25th of each month and are paid with the salary on the 10th.

Receipts over 1000 yuan need the approval screenshot attached."""


def corpus_file(name: str) -> bytes:
    """A committed corpus file's bytes."""
    return (CORPUS / name).read_bytes()


def zip_bomb(unpacked_mb: int = 20) -> bytes:
    """A .docx-shaped zip whose word/document.xml is `unpacked_mb` MB of zeros (a few KB packed)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        with archive.open("word/document.xml", "w", force_zip64=True) as member:
            block = b"\0" * (1024 * 1024)
            for _ in range(unpacked_mb):
                member.write(block)
    return buffer.getvalue()


def files_of_each_format() -> dict[str, bytes]:
    """One file per supported format, each holding a passage the tests search for."""
    return {
        "team-guide.md": corpus_file("team-guide.md"),
        "team-guide.pdf": corpus_file("team-guide.pdf"),
        "team-guide.docx": corpus_file("team-guide.docx"),
        "handbook.html": HANDBOOK_HTML.encode(),
        "expenses.txt": EXPENSES_TEXT.encode(),
    }
