# Copyright: (c) 2026, inferops.sglang contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every relative link in every tracked Markdown file resolves: the file (or
directory) exists, and an #anchor into a Markdown file names one of its
headings as GitHub makes anchors of them (lower case, punctuation dropped,
spaces to hyphens, a repeated heading suffixed -1, -2, ...). Links to other
sites (a scheme such as https: or mailto:) are not followed. Code (fenced
blocks and inline spans) is not read for links."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^ {0,3}(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target "title") and ![alt](target); the text may hold one level of brackets
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def tracked_markdown(root: Path = ROOT) -> list[Path]:
    """The repository's tracked *.md files (every *.md outside hidden and cache folders without git)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--", "*.md"], check=True,
                             capture_output=True, text=True).stdout
        return sorted(root / name for name in out.split("\0") if name and (root / name).is_file())
    except (OSError, subprocess.CalledProcessError):
        return sorted(p for p in root.rglob("*.md")
                      if not any(part.startswith(".") or part in ("node_modules", "__pycache__")
                                 for part in p.relative_to(root).parts))


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks, inline code spans blanked."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif line.strip().startswith(fence):
                fence = None
            continue
        if fence is None:
            yield number, INLINE_CODE.sub(lambda c: " " * len(c.group(0)), line)


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading's text (before the duplicate suffix)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)  # punctuation goes; letters, digits, _ and - stay
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a Markdown file offers: its headings' (GitHub style) and explicit <a name/id>."""
    seen: dict[str, int] = {}
    found = set()
    for _skip, line in _prose_lines(path.read_text(encoding="utf-8")):
        found.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        base = github_anchor(m.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path):
    """(line number, target) of every link in a Markdown file's prose."""
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        for target in INLINE_LINK.findall(line):
            yield number, target
        m = REFERENCE_DEF.match(line)
        if m:
            yield number, m.group(1)


def broken_links(files, root: Path = ROOT) -> list[str]:
    """'file:line: target (why)' for each relative link that does not resolve."""
    cache: dict[Path, set[str]] = {}
    broken = []
    for path in files:
        for number, target in links(path):
            if SCHEME.match(target) or target.startswith("//"):
                continue
            where = f"{path.relative_to(root) if path.is_relative_to(root) else path}:{number}: {target}"
            file_part, _sep, anchor = target.partition("#")
            file_part = unquote(file_part.split("?", 1)[0])
            if file_part.startswith("/"):
                dest = root / file_part.lstrip("/")  # GitHub resolves /x from the repository root
            else:
                dest = (path.parent / file_part) if file_part else path
            if not dest.exists():
                broken.append(f"{where} (no such file)")
                continue
            if anchor and dest.is_file() and dest.suffix.lower() == ".md":
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if unquote(anchor).lower() not in cache[dest]:
                    broken.append(f"{where} (no heading with that anchor)")
    return broken


def test_every_relative_link_in_the_tracked_markdown_resolves():
    files = tracked_markdown()
    assert len(files) > 10, files  # the README, docs/*.md, the roles' and plugins' pages at least
    broken = broken_links(files)
    assert not broken, "\n".join(broken)


def test_a_broken_file_or_anchor_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## How a deploy flows\n\n## Notes\n\n## Notes\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Top\n\n"
        "[ok](docs/page.md) [ok anchor](docs/page.md#how-a-deploy-flows) [dup](docs/page.md#notes-1)\n"
        "[self](#top) [site](https://example.invalid/x.md) [dir](docs/) ![img](docs/page.md)\n"
        "`[in code](nowhere.md)`\n"
        "```\n[in a fence](nowhere.md)\n```\n"
        "[missing](docs/gone.md)\n"
        "[bad anchor](docs/page.md#how-provisioning-flows)\n"
        "[bad self](#nothing-here)\n"
        "[ref]: docs/also-gone.md\n")
    broken = broken_links([readme], tmp_path)
    assert broken == [
        "README.md:9: docs/gone.md (no such file)",
        "README.md:10: docs/page.md#how-provisioning-flows (no heading with that anchor)",
        "README.md:11: #nothing-here (no heading with that anchor)",
        "README.md:12: docs/also-gone.md (no such file)",
    ]


@pytest.mark.parametrize("heading,anchor", [
    ("How a deploy flows", "how-a-deploy-flows"),
    ("The probe (`inferops.sglang.sglang_runtime_probe`)", "the-probe-inferopssglangsglang_runtime_probe"),
    ("Real SGLang in the lab", "real-sglang-in-the-lab"),
    ("From provisioning to deploy: the host manifest", "from-provisioning-to-deploy-the-host-manifest"),
    ("Idempotence and check mode", "idempotence-and-check-mode"),
])
def test_github_anchor(heading, anchor):
    assert github_anchor(heading) == anchor
