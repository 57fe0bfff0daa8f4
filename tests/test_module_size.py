"""A module is one concept: it is split where a reader would split it, not at a line count.

Length is only a prompt to look: a module past :data:`LONG` lines is listed in :data:`ALLOWED` with
the reason it is still one concept (a table a reader wants in one place, one protocol read top to
bottom), or it is split along its seams (the export by stage and mode, the memory backends one per
module, the trainer's config, setup and loop). A listed module that shrinks below the mark leaves
the list, so the list stays the set of long modules and why.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hrm_deploy"
LONG = 600  # lines; about what one concept takes at most in this code base

# module (relative to hrm_deploy/) -> why it is one concept at its length
ALLOWED: dict[str, str] = {}


def _lengths() -> dict[str, int]:
    return {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_long_module_says_why_it_is_one_concept() -> None:
    long = {name: n for name, n in _lengths().items() if n > LONG and name not in ALLOWED}
    assert not long, (
        f"modules past {LONG} lines: split each along its seams, or list it in ALLOWED "
        f"(tests/test_module_size.py) with the reason it is one concept: {long}"
    )


def test_the_list_holds_only_long_modules() -> None:
    lengths = _lengths()
    stale = {name: lengths.get(name) for name in ALLOWED if lengths.get(name, 0) <= LONG}
    assert not stale, f"no longer past {LONG} lines (or gone): take them out of ALLOWED: {stale}"
    assert all(reason.strip() for reason in ALLOWED.values()), "every listed module gives its reason"
