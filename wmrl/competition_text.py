"""A competition's description as the prompts show it: the sections a solution needs, the Evaluation
section always whole.

Kaggle descriptions (MLE-bench's description.md, MLE-Dojo's description.txt) carry sections no script
needs (Timeline, Prizes, Citation, ...): those go. What remains is kept whole while it fits
:data:`MAX_CHARS`; past that, sections other than Evaluation are cut from their ends, the latest
first, so the overview and the evaluation rules always reach the prompt.
"""

from __future__ import annotations

import re

MAX_CHARS = 6000
DROPPED = ("timeline", "prizes", "citation", "acknowledgements", "acknowledgments", "kernels requirements",
           "code requirements", "about", "prize", "rules")
_HEADING = re.compile(r"^(#{1,6})\s*(.+?)\s*#*\s*$")


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading, text) pairs in order; the text before the first heading has heading ''."""
    out: list[tuple[str, list[str]]] = [("", [])]
    for line in text.splitlines():
        match = _HEADING.match(line)
        if match:
            out.append((match.group(2), [line]))
        else:
            out[-1][1].append(line)
    return [(h, "\n".join(lines).strip("\n")) for h, lines in out if "\n".join(lines).strip()]


def _is(heading: str, names) -> bool:
    return heading.strip().lower().rstrip(":") in names


def condense(text: str, max_chars: int = MAX_CHARS) -> str:
    """``text`` without the sections no script needs, within ``max_chars`` (Evaluation kept whole)."""
    kept = [(h, body) for h, body in _sections(text) if not _is(h, DROPPED)]
    if sum(len(b) + 2 for _, b in kept) <= max_chars:
        return "\n\n".join(b for _, b in kept).strip()
    evaluation = sum(len(b) + 2 for h, b in kept if "evaluation" in h.lower())
    room = max(0, max_chars - evaluation)
    others = [i for i, (h, _) in enumerate(kept) if "evaluation" not in h.lower()]
    bodies = [b for _, b in kept]
    # Give each other section an equal share of the room, passing on what a short one leaves.
    share_left, left = room, len(others)
    for i in sorted(others, key=lambda i: len(bodies[i])):
        share = share_left // max(1, left)
        if len(bodies[i]) + 2 > share:
            bodies[i] = bodies[i][:max(0, share - 8)].rstrip() + " [...]"
        share_left -= len(bodies[i]) + 2
        left -= 1
    return "\n\n".join(b for b in bodies if b.strip() and b.strip() != "[...]").strip()


__all__ = ["MAX_CHARS", "condense"]
