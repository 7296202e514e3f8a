"""`qwenbot eval --retrieval FILE.jsonl`: how often `docs_search` finds the chunk that answers a question.

Each line of the file is one question and where its answer is written:

    {"q": "怎么申请 GPU 服务器的访问权限？", "doc": "team-guide", "heading": "开发环境配置 › 获取 GPU 服务器访问权限"}

`doc` is a document's name without its suffix (so team-guide.md, .pdf and .docx all count), `heading` the end of
the heading path of the chunk that answers (a whole step or more: "VPN", "开发环境配置 › VPN"). A question is
found when one of the top `k` results is such a chunk; recall@k is the share of questions found, and the rank of
the first right chunk is reported per question.

The corpus (by default the folder `corpus` beside the file's own folder: evals/docs.jsonl reads evals/docs/corpus/)
is indexed into a scratch database with the settings' chunk size, never the bot's; `--tokenizer` rebuilds that
index in another form of tools/docs_index.py, to measure it against the shipped one.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePath
from typing import Any, Iterable, Sequence

from bot.program.audit import insert_audit
from bot.program.evaluation import EvalFileError, jsonl_lines
from db import open_database
from tools.docs_chunks import SEPARATOR
from tools.docs_convert import SUFFIXES, is_cjk
from tools.docs_index import IndexForm
from tools.docs_store import DocsLimits, DocumentLibrary, Hit, Upload

DEFAULT_K = 5


@dataclass(frozen=True)
class RetrievalCase:
    """One question, and the document and heading whose chunk answers it."""

    question: str
    doc: str
    heading: str
    line: int = 0

    def answers(self, hit: Hit) -> bool:
        """Whether `hit` is a chunk of the right document under the right heading."""
        path = " ".join(hit.heading.split())
        wanted = " ".join(self.heading.split())
        right_place = path == wanted or path.endswith(SEPARATOR + wanted)
        return right_place and PurePath(hit.name).stem.casefold() == self.doc.casefold()

    @property
    def language(self) -> str:
        """zh for a question holding Chinese characters, else en."""
        return "zh" if any(is_cjk(ch) for ch in self.question) else "en"


@dataclass
class RetrievalResult:
    """Where the right chunk came for one question (None: not in the top k), and what came first."""

    case: RetrievalCase
    rank: int | None
    top: list[str] = field(default_factory=list)  # "heading — name" of the results, best first


@dataclass
class RetrievalReport:
    """A whole run: each question's result, and recall over all, per language and per document."""

    results: list[RetrievalResult]
    k: int
    about: dict[str, Any] = field(default_factory=dict)  # tokenizer, chunk size, documents and chunks indexed

    def recall(self, results: Sequence[RetrievalResult] | None = None) -> float:
        """The share of `results` (all by default) whose right chunk is in the top k."""
        chosen = self.results if results is None else results
        return sum(r.rank is not None for r in chosen) / len(chosen) if chosen else 0.0

    def first(self) -> float:
        """The share of questions whose right chunk came first (recall@1)."""
        return sum(r.rank == 1 for r in self.results) / len(self.results) if self.results else 0.0

    def mrr(self) -> float:
        """Mean reciprocal rank of the right chunk (0 for a question where it is not in the top k)."""
        return sum(1 / r.rank for r in self.results if r.rank) / len(self.results) if self.results else 0.0

    def groups(self) -> dict[str, list[RetrievalResult]]:
        """The results by question language and by document."""
        found: dict[str, list[RetrievalResult]] = {}
        for result in self.results:
            found.setdefault(result.case.language, []).append(result)
            found.setdefault(result.case.doc, []).append(result)
        return found

    def as_json(self) -> dict[str, Any]:
        """The report for `--report`."""
        return {**self.about, "k": self.k, "questions": len(self.results), f"recall@{self.k}": round(self.recall(), 4),
                "recall@1": round(self.first(), 4), "mrr": round(self.mrr(), 4),
                "by_group": {name: round(self.recall(group), 4) for name, group in self.groups().items()},
                "results": [{**asdict(r.case), "rank": r.rank, "top": r.top} for r in self.results]}


def load_retrieval_cases(path: Path) -> list[RetrievalCase]:
    """The questions of a retrieval JSONL file; a bad line is an `EvalFileError` naming it."""
    return [_case(line.where, line.number, line.item) for line in jsonl_lines(path)]


def _case(where: str, number: int, item: Any) -> RetrievalCase:
    if not isinstance(item, dict) or set(item) != {"q", "doc", "heading"} or \
            not all(isinstance(item[key], str) and item[key].strip() for key in item):
        raise EvalFileError(f'{where}: expected {{"q": "question", "doc": "name", "heading": "Section › Part"}}')
    return RetrievalCase(item["q"], item["doc"], item["heading"], number)


def default_corpus(path: Path) -> Path:
    """Where a question file's documents are: evals/docs.jsonl → evals/docs/corpus."""
    return path.with_suffix("") / "corpus"


def corpus_files(paths: Iterable[Path]) -> list[Path]:
    """The supported files among `paths` (folders searched through), in name order; none is an error."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
        elif path.is_file():
            found.append(path)
        else:
            raise EvalFileError(f"no such corpus file or folder: {path}")
    if not found:
        raise EvalFileError(f"no documents to index in {', '.join(map(str, paths))}")
    return found


async def evaluate_retrieval(cases: Sequence[RetrievalCase], corpus: Sequence[Path], limits: DocsLimits,
                             form: IndexForm, k: int = DEFAULT_K) -> RetrievalReport:
    """Index `corpus` into a scratch database in `form`, and ask every question of `cases` once."""
    with tempfile.TemporaryDirectory() as folder:
        db = await open_database(Path(folder) / "retrieval.sqlite3")
        try:
            library = DocumentLibrary(db, limits, audit=insert_audit)
            await library.rebuild_index(form)
            for path in corpus:
                await library.add(Upload(path.name, path.read_bytes()))
            results = [await _ask(library, case, k) for case in cases]
            chunks = sum(document.chunk_count for document in await library.documents())
        finally:
            await db.close()
    about = {"tokenizer": form.name, "chunk_chars": limits.chunk_chars, "documents": len(corpus), "chunks": chunks}
    return RetrievalReport(results, k, about)


async def _ask(library: DocumentLibrary, case: RetrievalCase, k: int) -> RetrievalResult:
    hits = await library.search(case.question, None, limit=k)
    rank = next((n for n, hit in enumerate(hits, 1) if case.answers(hit)), None)
    return RetrievalResult(case, rank, [f"{hit.heading} — {hit.name}" for hit in hits])


def retrieval_summary(report: RetrievalReport, source: str) -> list[str]:
    """The lines `qwenbot eval --retrieval` prints: one per question, then recall overall and by group."""
    lines = [_line(result) for result in report.results]
    about = ", ".join(f"{key} {value}" for key, value in report.about.items())
    found = sum(r.rank is not None for r in report.results)
    lines += ["", f"{source}: {len(report.results)} questions ({about})",
              f"recall@{report.k}: {found}/{len(report.results)} ({report.recall():.0%}); "
              f"recall@1 {report.first():.0%}, MRR {report.mrr():.2f}",
              "by group: " + ", ".join(f"{name} {report.recall(group):.0%} ({len(group)})"
                                       for name, group in report.groups().items())]
    return lines


def _line(result: RetrievalResult) -> str:
    if result.rank is not None:
        return f"✓ {result.rank} {result.case.question}"
    first = result.top[0] if result.top else "nothing"
    return f"✗ {result.case.question} (wanted {result.case.heading} in {result.case.doc}; first: {_short(first)})"


def _short(text: str, limit: int = 90) -> str:
    text = re.sub(r"\s+", " ", text)
    return text if len(text) <= limit else text[:limit - 1] + "…"
