"""A small instruction set from the project's docs (deterministic: the same file on every run).

    python make_data.py chats.jsonl

Each `## Heading` section of docs/*.md becomes one conversation: the user asks about the heading, the
assistant answers with the section's first sentences. One JSON object a line:
{"messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}]}.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
MAX_CHARS = 240  # an answer of at most this many characters: its first sentences


def sections(text: str):
    """(heading, first paragraph of prose) for every `##`-level heading of a markdown text."""
    for part in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        heading, _, body = part.partition("\n")
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", body)]
        prose = [p for p in paragraphs if p and not p.startswith(("```", "|", "#", "-", "*", ">", "<"))]
        if prose:
            yield heading.strip(), " ".join(prose[0].split())


def first_sentences(text: str) -> str:
    out = ""
    for sentence in re.split(r"(?<=[.:;])\s+", text):
        if out and len(out) + len(sentence) > MAX_CHARS:
            break
        out = f"{out} {sentence}".strip()
    return out[:MAX_CHARS]


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "chats.jsonl")
    rows = []
    for doc in sorted(DOCS.glob("*.md")):
        for heading, prose in sections(doc.read_text()):
            rows.append({"messages": [
                {"role": "user", "content": f"What does {doc.stem}.md say under \"{heading}\"?"},
                {"role": "assistant", "content": first_sentences(prose)}]})
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{out}: {len(rows)} conversations from {DOCS.name}/*.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
