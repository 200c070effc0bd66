#!/usr/bin/env python3
"""Check the relative links and anchors of the repository's Markdown documents.

    scripts/check-doc-links.py            # README.md, CHANGELOG.md, docs/*.md, fuzz/README.md

Every `[text](target)` whose target is not a URL must name an existing file (relative to the
document), and a `#anchor` must be a heading of that file, spelled as GitHub spells heading
anchors (lower case; punctuation but `-` and `_` dropped; spaces to `-`; a repeated heading gets
`-1`, `-2`, ...). Links inside code spans and fenced blocks are not links. Exits 1 listing each
broken link.
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def strip_code(text):
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path):
    seen = {}
    out = set()
    in_fence = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        m = None if in_fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
        slug = re.sub(r"[^\w\- ]", "", title.lower().replace("`", "")).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def main():
    docs = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "fuzz" / "README.md"]
    docs += sorted((ROOT / "docs").glob("*.md"))
    bad = []
    checked = 0
    for doc in docs:
        if not doc.exists():
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", strip_code(doc.read_text())):
            if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
                continue
            checked += 1
            file, _, anchor = target.partition("#")
            dest = (doc.parent / file).resolve() if file else doc
            rel = doc.relative_to(ROOT)
            if not dest.exists():
                bad.append(f"{rel}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{rel}: {target}: no such heading")
    for b in bad:
        print(b)
    print(f"{checked} relative links checked, {len(bad)} broken")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
