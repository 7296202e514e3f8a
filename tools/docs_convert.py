"""A document file to text: its title and its blocks (headings and paragraphs, in order), one converter per format.

    converted = convert("guide.pdf", data, ArchiveLimits(max_unpacked_bytes=…, max_ratio=…))
    converted.title, converted.blocks   # "课程研发团队工作指南", [Heading(1, …), Paragraph(…), …]

Formats: Markdown (.md, .markdown), plain text (.txt, .text), PDF (.pdf), Word (.docx) and HTML (.html, .htm),
told by the file name and checked against the bytes (a PDF starts with `%PDF`, a .docx is a zip holding
`word/document.xml`). Whatever cannot be used raises `DocumentError` with one line saying why: an unknown type, a
file that is not what its name says, an encrypted PDF, a .docx whose archive declares more than `max_unpacked_bytes`
or unpacks more than `max_ratio` times its packed size (a zip bomb: checked from the archive's directory before
anything is unpacked, and zipfile never unpacks past a member's declared size), and a file with no text at all
(a scanned PDF: it needs OCR first).

The libraries, chosen by trying both candidates on the corpus in evals/docs/ (what each installs and pulls in:
bench/README.md, "Documents"): pypdf (PDF text and outline), python-docx (.docx paragraphs with their styles,
tables) and markdownify (HTML to Markdown, over BeautifulSoup): small, pure Python but for lxml (which python-docx
needs), no network code. markitdown would do every format in one call, but it brings onnxruntime and numpy (for
guessing file types), pdfminer, pdfplumber, pypdfium2, Pillow, cryptography and requests, gives a PDF no headings
either, and its .docx converter refused the guide python-docx wrote ("Could not find the body element") where
python-docx and mammoth read it. Headings are what the chunks are cut by and what answers cite, so each converter
keeps them: Markdown and HTML headings, Word's Heading/Title styles, and a PDF's outline (bookmarks, which Word and
LibreOffice export from headings) matched to the lines of its pages; a PDF without an outline is paragraphs under
its title.
"""

from __future__ import annotations

import io
import re
import unicodedata
import zipfile
from dataclasses import dataclass
from pathlib import PurePath
from typing import Iterable, Iterator

from tools.errors import DocumentError

MB = 1024 * 1024  # Telegram's "20 MB" for bots' downloads is 20 MiB
MARKDOWN = (".md", ".markdown")
TEXT = (".txt", ".text")
SUFFIXES = (*MARKDOWN, *TEXT, ".pdf", ".docx", ".html", ".htm")
# Formats people send that look close to supported ones: say what to do instead.
ADVICE = {".doc": "save it as .docx", ".rtf": "save it as .docx", ".odt": "save it as .docx",
          ".pptx": "export it as PDF", ".ppt": "export it as PDF", ".xlsx": "save it as CSV text (.txt)",
          ".epub": "convert it to HTML or PDF"}
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$")
_SETEXT = re.compile(r"^(=+|-+)[ \t]*$")
_FENCE = re.compile(r"^[ \t]*(```|~~~)")
_LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


@dataclass(frozen=True)
class Heading:
    """A heading of `level` 1 (the title) to 6."""

    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    """A paragraph, a list, a table or a code block: text that is cut only when it is too long for one chunk."""

    text: str


Block = Heading | Paragraph


@dataclass(frozen=True)
class Converted:
    """A document as text: its title (first heading, metadata, or the file's name) and its blocks."""

    title: str
    blocks: tuple[Block, ...]

    @property
    def text_chars(self) -> int:
        """How much text it holds (headings and paragraphs)."""
        return sum(len(block.text) for block in self.blocks)


@dataclass(frozen=True)
class ArchiveLimits:
    """What a .docx (a zip archive) may unpack to before python-docx opens it."""

    max_unpacked_bytes: int
    max_ratio: float


def suffix_of(name: str) -> str:
    """The file name's type suffix, lower case (`.pdf`), or "" when it has none."""
    return PurePath(name).suffix.lower()


def check_type(name: str) -> str:
    """The suffix of a supported file name; `DocumentError` naming the supported types for any other."""
    suffix = suffix_of(name)
    if suffix in SUFFIXES:
        return suffix
    known = " ".join(dict.fromkeys(SUFFIXES))
    what = f"{suffix} files are" if suffix else "a file without a type suffix is"
    advice = f" ({ADVICE[suffix]})" if suffix in ADVICE else ""
    raise DocumentError(f"{name}: {what} not supported{advice}; supported: {known}")


def convert(name: str, data: bytes, limits: ArchiveLimits) -> Converted:
    """The title and blocks of the file `name` holding `data`; `DocumentError` when it cannot be used."""
    suffix = check_type(name)
    stem = PurePath(name).stem or name
    if suffix == ".pdf":
        converted = _pdf(name, data, stem)
    elif suffix == ".docx":
        converted = _docx(name, data, stem, limits)
    elif suffix in (".html", ".htm"):
        converted = _html(name, data, stem)
    elif suffix in MARKDOWN:
        converted = _titled(markdown_blocks(decode_text(name, data)), stem)
    else:
        converted = _titled(text_blocks(decode_text(name, data)), stem)
    if not any(ch.isalnum() for block in converted.blocks for ch in block.text):
        hint = " (a scanned PDF? it needs OCR first)" if suffix == ".pdf" else ""
        raise DocumentError(f"{name}: no text could be extracted{hint}")
    return converted


# --- plain text and Markdown -----------------------------------------------------------------------------------

def decode_text(name: str, data: bytes) -> str:
    """The text of a text file: UTF-8 (a BOM allowed), UTF-16 with a BOM, or GB18030 (Chinese Windows files)."""
    if b"\x00" in data and not data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise DocumentError(f"{name}: this is not a text file (it holds binary data)")
    for encoding in ("utf-8-sig", "utf-16", "gb18030"):
        if encoding == "utf-16" and not data.startswith((b"\xff\xfe", b"\xfe\xff")):
            continue
        try:
            return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")
        except UnicodeDecodeError:
            continue
    raise DocumentError(f"{name}: the text is neither UTF-8, UTF-16 nor GB18030")


def text_blocks(text: str) -> list[Block]:
    """Plain text: paragraphs separated by blank lines, no headings."""
    return [Paragraph(part.strip()) for part in re.split(r"\n[ \t]*\n", text) if part.strip()]


def markdown_blocks(text: str) -> list[Block]:
    """Markdown: ATX and setext headings, and paragraphs (a fenced code block stays one paragraph)."""
    blocks: list[Block] = []
    lines: list[str] = []
    fence: str | None = None

    def flush() -> None:
        if any(line.strip() for line in lines):
            blocks.append(Paragraph(_plain_links("\n".join(lines).strip("\n"))))
        lines.clear()

    for line in text.split("\n"):
        if fence is not None:
            lines.append(line)
            if line.strip().startswith(fence):
                fence = None
                flush()
        elif (opening := _FENCE.match(line)) is not None:
            flush()
            fence, lines[:] = opening.group(1), [line]
        elif (heading := _HEADING.match(line)) is not None:
            flush()
            blocks.append(Heading(len(heading.group(1)), heading_text(heading.group(2))))
        elif _SETEXT.match(line) and len(lines) == 1 and lines[0].strip():
            blocks.append(Heading(1 if line.strip()[0] == "=" else 2, heading_text(lines.pop())))
        elif not line.strip():
            flush()
        else:
            lines.append(line)
    flush()
    return blocks


def heading_text(raw: str) -> str:
    """A heading as a path shows it: links made text, no code ticks or emphasis marks, spaces collapsed."""
    text = _plain_links(raw).replace("`", "")
    text = re.sub(r"(\*\*|__|(?<!\w)[*_](?=\S)|(?<=\S)[*_](?!\w))", "", text)
    return " ".join(text.split())


def _plain_links(text: str) -> str:
    """Links as their text; an absolute URL stays beside it in brackets, a relative one (a file of the repo) goes."""
    def one(match: re.Match[str]) -> str:
        label, url = match.group(1), match.group(2)
        absolute = re.match(r"^[a-z][a-z0-9+.-]*:", url, re.IGNORECASE) is not None
        return f"{label} ({url})" if absolute and label and url != label else (label or url)
    return _LINK.sub(one, text)


def _titled(blocks: list[Block], fallback: str, metadata_title: str = "") -> Converted:
    """Blocks with the document's title: its first level-1 heading, else the metadata title, else `fallback`."""
    first = next((b.text for b in blocks if isinstance(b, Heading) and b.level == 1 and b.text), "")
    return Converted(first or " ".join(metadata_title.split()) or fallback, tuple(blocks))


# --- HTML ------------------------------------------------------------------------------------------------------

def _html(name: str, data: bytes, stem: str) -> Converted:
    """HTML through markdownify: headings stay headings, lists and tables stay readable; scripts and styles go."""
    from bs4 import BeautifulSoup
    from markdownify import MarkdownConverter

    soup = BeautifulSoup(data, "html.parser")  # bytes: BeautifulSoup finds the encoding (meta charset, BOM)
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    for tag in soup(["head", "script", "style", "noscript", "template", "svg", "iframe", "object"]):
        tag.decompose()
    converter = MarkdownConverter(heading_style="ATX", escape_asterisks=False, escape_underscores=False,
                                  escape_misc=False, bullets="-")
    return _titled(markdown_blocks(converter.convert_soup(soup)), stem, title)


# --- Word ------------------------------------------------------------------------------------------------------

def _docx(name: str, data: bytes, stem: str, limits: ArchiveLimits) -> Converted:
    """A .docx: paragraphs in order, Heading N and Title styles as headings, tables as rows of cells."""
    from docx import Document
    from docx.table import Table

    check_archive(name, data, limits)
    try:
        document = Document(io.BytesIO(data))
    except Exception as error:  # python-docx raises KeyError, ValueError, lxml errors… for a broken file
        raise DocumentError(f"{name}: not a Word document that can be read ({type(error).__name__})") from None
    blocks: list[Block] = []
    for item in document.iter_inner_content():
        if isinstance(item, Table):
            blocks += _table_blocks(item)
        elif (text := " ".join(item.text.split())):
            level = _heading_level(item.style.name if item.style is not None else "")
            blocks.append(Heading(level, text) if level else Paragraph(text))
    return _titled(blocks, stem, document.core_properties.title or "")


def _heading_level(style: str) -> int:
    """1-6 for Word's Title and Heading N styles, 0 for any other."""
    if style == "Title":
        return 1
    match = re.match(r"^Heading (\d)$", style)
    return min(int(match.group(1)), 6) if match else 0


def _table_blocks(table: object) -> list[Block]:
    """A table as one paragraph: a row per line, cells joined by ' | ' (a merged cell once)."""
    rows = []
    for row in table.rows:  # type: ignore[attr-defined]
        cells = list(dict.fromkeys(" ".join(cell.text.split()) for cell in row.cells))
        if any(cells):
            rows.append(" | ".join(cells))
    return [Paragraph("\n".join(rows))] if rows else []


def check_archive(name: str, data: bytes, limits: ArchiveLimits) -> None:
    """Refuse a .docx that is no zip, has no word/document.xml, or would unpack too much (a zip bomb), from the
    sizes its directory declares (zipfile never unpacks a member past its declared size)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError):
        raise DocumentError(f"{name}: not a Word document (.docx files are zip archives; this one is not)") from None
    if "word/document.xml" not in {member.filename for member in members}:
        raise DocumentError(f"{name}: not a Word document (no word/document.xml inside)")
    unpacked = sum(member.file_size for member in members)
    packed = max(sum(member.compress_size for member in members), 1)
    if unpacked > limits.max_unpacked_bytes or unpacked / packed > limits.max_ratio:
        raise DocumentError(f"{name}: refused as a possible zip bomb: it unpacks to {megabytes(unpacked)} "
                            f"({unpacked / packed:.0f} times its size); the limits are "
                            f"{megabytes(limits.max_unpacked_bytes)} and {limits.max_ratio:g} times")


def megabytes(size: int) -> str:
    """A size for people, in units of 1024 as Telegram counts its limits: `1.5 MB`, `320 KB`, `12 bytes`."""
    if size >= MB:
        return f"{size / MB:.1f} MB"
    return f"{size / 1024:.0f} KB" if size >= 1024 else f"{size} bytes"


# --- PDF -------------------------------------------------------------------------------------------------------

def _pdf(name: str, data: bytes, stem: str) -> Converted:
    """A PDF's text page by page; its outline entries, found among the lines, become the headings."""
    from pypdf import PdfReader
    from pypdf.errors import DependencyError, PyPdfError

    if not data.lstrip()[:5].startswith(b"%PDF"):
        raise DocumentError(f"{name}: not a PDF (it does not start with %PDF)")
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise DocumentError(f"{name}: the PDF is encrypted: send a copy without a password")
        pages = [page.extract_text() or "" for page in reader.pages]
        outline = list(_outline(reader))
        title = (reader.metadata.title if reader.metadata else None) or ""
    except DocumentError:
        raise
    except (PyPdfError, DependencyError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
        # A broken file, or one needing what pypdf lacks here (AES decryption wants the cryptography package).
        raise DocumentError(f"{name}: the PDF cannot be read ({type(error).__name__})") from None
    return _titled(pdf_blocks(pages, outline), stem, str(title))


def _outline(reader: object) -> Iterator[tuple[int, str]]:
    """(level, title) of each outline entry, in document order (nested lists are the next level down)."""
    def walk(entries: Iterable[object], level: int) -> Iterator[tuple[int, str]]:
        for entry in entries:
            if isinstance(entry, list):
                yield from walk(entry, level + 1)
            elif (title := " ".join(str(getattr(entry, "title", "") or "").split())):
                yield min(level, 6), title
    try:
        yield from walk(reader.outline, 1)  # type: ignore[attr-defined]
    except Exception:  # a broken outline is no reason to refuse the text
        return


def pdf_blocks(pages: list[str], outline: list[tuple[int, str]]) -> list[Block]:
    """Blocks from page texts: a line that is the next outline title (spaces ignored) becomes that heading; the
    lines between headings are joined into paragraphs (a line ending a sentence short of the page width ends one)."""
    blocks: list[Block] = []
    lines: list[str] = []
    expected = iter(outline)
    wanted = next(expected, None)
    width = max((len(line) for page in pages for line in page.splitlines()), default=0)
    for line in (line.strip() for page in pages for line in page.splitlines()):
        if not line:
            continue
        if wanted is not None and _squeezed(line) == _squeezed(wanted[1]):
            blocks += _paragraphs(lines, width)
            lines = []
            blocks.append(Heading(wanted[0], wanted[1]))
            wanted = next(expected, None)
        else:
            lines.append(line)
    return blocks + _paragraphs(lines, width)


def _squeezed(text: str) -> str:
    return "".join(unicodedata.normalize("NFKC", text).split()).casefold()


def _paragraphs(lines: list[str], width: int) -> list[Block]:
    """Wrapped lines joined back; a line that ends a sentence well short of the widest line ends a paragraph."""
    paragraphs, current = [], ""
    for line in lines:
        current = join_wrapped(current, line)
        if line[-1] in "。！？.!?:：" and len(line) < width * 0.8:
            paragraphs.append(Paragraph(current))
            current = ""
    if current:
        paragraphs.append(Paragraph(current))
    return paragraphs


def join_wrapped(left: str, right: str) -> str:
    """Two pieces of a wrapped line: no space between Chinese (or Japanese) characters, one between words."""
    if not left:
        return right
    if is_cjk(left[-1]) or is_cjk(right[0]):
        return left + right
    return left[:-1] + right if left.endswith("-") and right[:1].islower() else f"{left} {right}"


def is_cjk(char: str) -> bool:
    """Whether `char` is written without spaces between words: CJK ideographs, kana, hangul, CJK punctuation."""
    code = ord(char)
    return (0x3000 <= code <= 0x30FF or 0x3400 <= code <= 0x4DBF or 0x4E00 <= code <= 0x9FFF
            or 0xAC00 <= code <= 0xD7AF or 0xF900 <= code <= 0xFAFF or 0xFF00 <= code <= 0xFF60
            or 0x20000 <= code <= 0x2FFFF)

