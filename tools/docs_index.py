"""How chunks are indexed for full-text search in SQLite's FTS5, and how a question becomes an FTS5 query.

FTS5's own tokenizers do not split Chinese into words: `unicode61` takes a whole run of Chinese characters as one
token, so a question matches only a chunk holding exactly that run. Two ways round it were measured on
evals/docs.jsonl (recall@5 of the chunk that answers, bench/README.md, "Documents"):

    trigram   FTS5's `trigram` tokenizer: every three characters are a token, so any substring of three or more
              characters matches. A question is cut into its words (Latin) and overlapping three-character pieces
              (Chinese). Two-character Chinese words (报销, 请假, 令牌) cannot match on their own.
    bigram    `unicode61` over text where each run of Chinese characters is rewritten as its overlapping pairs
              (令牌与密钥 → 令牌 牌与 与密 密钥), the classic approach of Lucene's CJK analyzer; Latin words stay
              words. The question gets the same rewriting. `porter-bigram` adds English stemming on top.

`DEFAULT_FORM` is the one migrations/0012_documents.sql builds. The others stay here for `qwenbot eval --retrieval
… --tokenizer NAME`, which rebuilds a scratch index in that form to measure it again. A query is the OR of its
terms ranked by BM25, so a chunk holding more of the rarer terms comes first; common English words are dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from tools.docs_convert import is_cjk

INDEX_TABLE = "document_index"
# Heading paths are short and say what a section is about: a term there counts twice a term in the text.
HEADING_WEIGHT, BODY_WEIGHT = 2.0, 1.0
MAX_QUERY_TERMS = 64  # a long question is cut here: its first terms carry it, and the query stays fast
_RUN = re.compile(r"[^\W_]+", re.UNICODE)
STOPWORDS = frozenset(
    "a an and are as at be by can could did do does for from had has have how i if in into is it its me my of on "
    "or our should so than that the their them then there these they this to was we were what when where which "
    "who why will with would you your".split())


@dataclass(frozen=True)
class IndexForm:
    """One way of indexing: the FTS5 tokenizer, how text is written into the index, how a question is queried."""

    name: str
    tokenizer: str
    index_text: Callable[[str], str]
    terms: Callable[[str], list[str]]

    def create_sql(self, table: str = INDEX_TABLE) -> str:
        """The statement creating the index table in this form (rowid = the chunk's id)."""
        return f"CREATE VIRTUAL TABLE {table} USING fts5(heading, body, tokenize = '{self.tokenizer}')"

    def query(self, question: str) -> str | None:
        """An FTS5 query matching any of the question's terms (each quoted, so nothing is read as syntax), or
        None when the question has no term this form can match."""
        terms = list(dict.fromkeys(self.terms(question)))[:MAX_QUERY_TERMS]
        return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms) or None


def words_and_runs(text: str) -> list[tuple[str, bool]]:
    """The text's words, and its runs of CJK characters, in order: (piece, is_cjk). Case folded."""
    pieces: list[tuple[str, bool]] = []
    for match in _RUN.finditer(text.casefold()):
        token = match.group()
        start = 0
        for index in range(1, len(token) + 1):  # split where the script changes: "gpu服务器" → "gpu", "服务器"
            if index == len(token) or is_cjk(token[index]) != is_cjk(token[start]):
                pieces.append((token[start:index], is_cjk(token[start])))
                start = index
    return pieces


def ngrams(run: str, size: int) -> list[str]:
    """Overlapping pieces of `size` characters of `run` (the run itself when it is shorter)."""
    if len(run) <= size:
        return [run]
    return [run[i:i + size] for i in range(len(run) - size + 1)]


def bigram_text(text: str) -> str:
    """Text as the bigram form indexes it: each CJK run as its overlapping pairs, words as they are."""
    return " ".join(" ".join(ngrams(piece, 2)) if cjk else piece for piece, cjk in words_and_runs(text))


def bigram_terms(question: str) -> list[str]:
    """A question's terms in the bigram form: CJK pairs, and words other than common English ones."""
    terms: list[str] = []
    for piece, cjk in words_and_runs(question):
        if cjk:
            terms += ngrams(piece, 2)
        elif piece not in STOPWORDS:
            terms.append(piece)
    return terms


def trigram_terms(question: str) -> list[str]:
    """A question's terms in the trigram form: CJK runs as overlapping triples, words of three letters or more
    (the trigram tokenizer matches nothing shorter)."""
    terms: list[str] = []
    for piece, cjk in words_and_runs(question):
        if cjk:
            terms += [gram for gram in ngrams(piece, 3) if len(gram) == 3]
        elif len(piece) >= 3 and piece not in STOPWORDS:
            terms.append(piece)
    return terms


TRIGRAM = IndexForm("trigram", "trigram", lambda text: text, trigram_terms)
BIGRAM = IndexForm("bigram", "unicode61 remove_diacritics 2", bigram_text, bigram_terms)
PORTER_BIGRAM = IndexForm("porter-bigram", "porter unicode61 remove_diacritics 2", bigram_text, bigram_terms)
FORMS = {form.name: form for form in (TRIGRAM, BIGRAM, PORTER_BIGRAM)}
DEFAULT_FORM = PORTER_BIGRAM
