"""Reading the documentation pages (README.md and docs/*.md) for tests/test_docs.py: their fenced blocks, the
command lines of their shell blocks, their links, and the import paths and repository paths they name.

A block is not run when the line directly above its opening fence is `<!-- not run: REASON -->`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOT_RUN = re.compile(r"^<!-- not run: (?P<reason>.+?) -->$")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")
# A Markdown link to a page or file of the repository: [text](target) (web addresses are left alone).
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
# A name in backticks: `inloop_eval.x.y` (a module, or a module's attribute).
DOTTED = re.compile(r"`(?P<name>inloop_eval(?:\.\w+)+)`")
# `from a.b import c, d` or `import a.b`, in code or inline in backticks.
FROM_IMPORT = re.compile(r"^\s*from (?P<module>[\w.]+) import (?P<names>[\w, ]+?)\s*(?:#.*)?$")
PLAIN_IMPORT = re.compile(r"^\s*import (?P<module>[\w.]+)(?: as \w+)?\s*(?:#.*)?$")
INLINE_FROM_IMPORT = re.compile(r"`from (?P<module>inloop_eval[\w.]*) import (?P<names>[\w, ]+)`")
# A path in backticks under one of the repository's folders (or the package's, as design.md writes them).
CODE_SPAN = re.compile(r"`(?P<span>[^`\s]+)`")
TOP_FOLDERS = ("inloop_eval", "tests", "benchmarks", "configs", "scripts", "docs", ".ci")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: str
    """The page's path from the repository root."""
    line: int
    """The line of its opening fence (1-based)."""
    lang: str
    text: str
    not_run: str | None
    """The reason given above it, when it is marked not to run."""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """README.md and every page of docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def page_name(path: Path) -> str:
    return str(path.relative_to(REPO))


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a page, in order."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```"), None)
        if end is None:
            raise AssertionError(f"{page_name(path)}:{i + 1}: a fence that is never closed")
        marker = NOT_RUN.match(lines[i - 1].strip()) if i > 0 else None
        text = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Block(page_name(path), i + 1, opening["lang"], text, marker["reason"] if marker else None))
        i = end + 1
    return found


def markers_without_block(path: Path) -> list[str]:
    """`<!-- not run -->` markers that are not directly above a fence (they would mark nothing)."""
    lines = path.read_text().splitlines()
    return [
        f"{page_name(path)}:{i + 1}"
        for i, line in enumerate(lines)
        if line.strip().startswith("<!-- not run") and (i + 1 >= len(lines) or not FENCE.match(lines[i + 1]))
    ]


def prose(path: Path) -> str:
    """The page without its fenced blocks."""
    out, inside = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line) or (inside and line.rstrip() == "```"):
            inside = not inside
            continue
        if not inside:
            out.append(line)
    return "\n".join(out)


def command_lines(block: Block) -> list[list[str]]:
    """The commands of a shell block, each as its words: continuation lines joined, comments dropped, and
    commands joined by `&&` split apart."""
    joined = block.text.replace("\\\n", " ")
    commands: list[list[str]] = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            if words[:cut]:
                commands.append(words[:cut])
            words = words[cut + 1 :]
    return commands


def cli_words(words: list[str]) -> list[str] | None:
    """The arguments of an `inloop-eval` command (also `torchrun ... -m inloop_eval.cli ...`), or None when
    the command is another program."""
    words = words[1:] if words[:1] == ["time"] else words
    if words[:1] == ["inloop-eval"]:
        return words[1:]
    if "inloop_eval.cli" in words and "-m" in words:
        return words[words.index("inloop_eval.cli") + 1 :]
    return None


def script_and_flags(words: list[str]) -> tuple[Path, list[str]] | None:
    """(the source file, the flags) of a `python -m benchmarks.<name>` or `python scripts/<file>` command (under
    `torchrun` or `time` too); None for any other program."""
    for i, word in enumerate(words):
        if word == "-m" and i + 1 < len(words) and words[i + 1].startswith("benchmarks."):
            return REPO / (words[i + 1].replace(".", "/") + ".py"), flags(words[i + 2 :])
        if word.startswith("scripts/") and word.endswith(".py"):
            return REPO / word, flags(words[i + 1 :])
    return None


def flags(words: list[str]) -> list[str]:
    """The `--flag` words of a command line (without `=value`)."""
    return [w.split("=", 1)[0] for w in words if w.startswith("--")]


def links(path: Path) -> list[str]:
    """The targets of the page's links that are not web addresses."""
    return [
        m["target"] for m in LINK.finditer(prose(path)) if not re.match(r"^[a-z]+:", m["target"])
    ]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped but for `-` and `_`, spaces as `-`."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {anchor(line.lstrip("#")) for line in prose(path).splitlines() if line.startswith("#")}


def import_paths(path: Path) -> list[tuple[str, str | None]]:
    """(module, attribute or None) for every import path the page names: the imports of its Python blocks
    (run or not), `from inloop_eval... import ...` in its prose, and every `inloop_eval.<...>` name in
    backticks (a module, or a module's attribute)."""
    found: list[tuple[str, str | None]] = []
    for block in blocks(path):
        if block.lang != "python":
            continue
        for line in block.text.splitlines():
            if m := FROM_IMPORT.match(line):
                found += [(m["module"], name.strip()) for name in m["names"].split(",") if name.strip()]
            elif m := PLAIN_IMPORT.match(line):
                found.append((m["module"], None))
    text = prose(path)
    for m in INLINE_FROM_IMPORT.finditer(text):
        found += [(m["module"], name.strip()) for name in m["names"].split(",") if name.strip()]
    found += [(m["name"], None) for m in DOTTED.finditer(text)]
    return list(dict.fromkeys(found))


def repository_paths(path: Path) -> list[str]:
    """Paths in backticks under the repository's folders (`tests/...`, `inloop_eval/...`, `configs/...`) or the
    package's (`engine/outputs/...`, as design.md writes them): each must exist."""
    package_folders = tuple(p.name for p in (REPO / "inloop_eval").iterdir() if p.is_dir() and p.name != "__pycache__")
    found = []
    for m in CODE_SPAN.finditer(prose(path)):
        span = m["span"].split("::", 1)[0].rstrip(",.;:")
        if "/" not in span or any(c in span for c in "<>*{}$@"):
            continue
        if span.split("/", 1)[0] in TOP_FOLDERS + package_folders:
            found.append(span)
    return list(dict.fromkeys(found))


def resolves(span: str) -> bool:
    """Whether a path a page names is in the repository, from its root or from the package's (a module may be
    named without its `.py`: `compare/pairing`)."""
    return any((root / name).exists() for root in (REPO, REPO / "inloop_eval") for name in (span, f"{span}.py"))
