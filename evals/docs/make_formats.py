"""Make the Word and PDF copies of corpus/team-guide.md, and the scanned-PDF test fixture.

    python evals/docs/make_formats.py            # corpus/team-guide.docx and corpus/team-guide.pdf
    python evals/docs/make_formats.py --scanned  # also tests/data/docs/scanned.pdf (a page as a picture, no text)

Not part of the bot: it needs `python-docx`, `reportlab` and `pillow` (pip) and a CJK TrueType font from Debian
(`apt-get install fonts-wqy-zenhei`). The .docx uses Word's built-in Heading 1-3 styles, as a guide written in
Word would; the PDF embeds the font and carries an outline (bookmarks) of the headings, as Word's and
LibreOffice's PDF export do. evals/docs/README.md says how the committed files were made.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "corpus" / "team-guide.md"
FONT_FILE = Path("/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc")
SCANNED = HERE.parent.parent / "tests" / "data" / "docs" / "scanned.pdf"


def blocks(markdown: str) -> list[tuple[int, str]]:
    """(heading level, text) for headings and (0, text) for paragraphs, in order; code spans lose their ticks."""
    found = []
    for block in re.split(r"\n\s*\n", markdown.strip()):
        text = " ".join(line.strip() for line in block.splitlines())
        heading = re.match(r"^(#{1,6})\s+(.*)$", text)
        level, text = (len(heading.group(1)), heading.group(2)) if heading else (0, text)
        found.append((level, text.replace("`", "")))
    return found


def make_docx(parts: list[tuple[int, str]], target: Path) -> None:
    """A Word document: the title in Heading 1 (Word's Title style is not a heading), paragraphs in Normal."""
    from docx import Document
    from docx.oxml.ns import qn

    document = Document()
    for style in ("Normal", "Heading 1", "Heading 2", "Heading 3"):
        fonts = document.styles[style].element.get_or_add_rPr().get_or_add_rFonts()
        fonts.set(qn("w:eastAsia"), "WenQuanYi Zen Hei")  # what a Chinese Word install would pick
    document.core_properties.title = parts[0][1]
    for level, text in parts:
        if level:
            document.add_heading(text, level=min(level, 3))
        else:
            document.add_paragraph(text)
    document.save(target)


def make_pdf(parts: list[tuple[int, str]], target: Path) -> None:
    """A PDF with the font embedded and an outline entry per heading (nested by level)."""
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import ParagraphStyle
    from reportlab.pdfbase import pdfmetrics
    from reportlab.pdfbase.ttfonts import TTFont
    from reportlab.platypus import Paragraph, SimpleDocTemplate, Spacer

    pdfmetrics.registerFont(TTFont("ZenHei", str(FONT_FILE), subfontIndex=0))
    body = ParagraphStyle("body", fontName="ZenHei", fontSize=10.5, leading=16, wordWrap="CJK")
    heads = {level: ParagraphStyle(f"h{level}", fontName="ZenHei", fontSize=size, leading=size * 1.5,
                                   spaceBefore=8, spaceAfter=4, wordWrap="CJK")
             for level, size in ((1, 18), (2, 14), (3, 12))}

    class Guide(SimpleDocTemplate):
        def afterFlowable(self, flowable):  # noqa: N802 - reportlab's hook name
            level = getattr(flowable, "outline_level", None)
            if level is not None:
                key = f"h{id(flowable)}"
                self.canv.bookmarkPage(key)
                self.canv.addOutlineEntry(flowable.getPlainText(), key, level=level - 1, closed=False)

    story = []
    for level, text in parts:
        if level:
            heading = Paragraph(text, heads[min(level, 3)])
            heading.outline_level = min(level, 3)
            story.append(heading)
        else:
            story += [Paragraph(text, body), Spacer(1, 4)]
    Guide(str(target), pagesize=A4, title=parts[0][1], author="课程研发团队").build(story)


def make_scanned(target: Path) -> None:
    """A one-page PDF holding only a picture of text, as a scanner makes: nothing to extract."""
    from PIL import Image, ImageDraw, ImageFont

    page = Image.new("L", (1240, 1754), 255)  # A4 at 150 dpi, greyscale
    draw = ImageDraw.Draw(page)
    font = ImageFont.truetype(str(FONT_FILE), 40)
    lines = ["报销说明（扫描件）", "报销单在每月二十五日之前提交。", "Expense claims are due by the 25th."]
    for number, line in enumerate(lines):
        draw.text((120, 160 + number * 80), line, fill=0, font=font)
    target.parent.mkdir(parents=True, exist_ok=True)
    page.save(target, "PDF", resolution=150.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scanned", action="store_true", help=f"also write {SCANNED}")
    args = parser.parse_args()
    parts = blocks(SOURCE.read_text(encoding="utf-8"))
    make_docx(parts, SOURCE.with_suffix(".docx"))
    make_pdf(parts, SOURCE.with_suffix(".pdf"))
    if args.scanned:
        make_scanned(SCANNED)


if __name__ == "__main__":
    main()
