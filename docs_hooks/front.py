"""The site's front page: README.md with its links rewritten for the site.

README.md is written for GitHub, where it sits at the repository root and links into
``docs/``; on the site it is ``index.md`` at the root of ``docs/``. So ``docs/X`` becomes
``X``, and a link to a repository file outside ``docs/`` (which the site does not publish)
becomes the link's text followed by the path as code. Links with a scheme, anchors and
mail links are kept as they are.
"""

from __future__ import annotations

import re

__all__ = ["front_page", "site_link"]

_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def site_link(target: str) -> str | None:
    """The site's form of a README link target, or None where the site has no page for it."""
    if "://" in target or target.startswith(("#", "mailto:")):
        return target
    path = target.removeprefix("./")
    if path.startswith("docs/"):
        return path[len("docs/"):]
    return None


def front_page(readme: str) -> str:
    """README.md's text as the site's ``index.md`` (code blocks are left as they are)."""

    def rewrite(m: re.Match) -> str:
        bang, text, target = m.groups()
        new = site_link(target)
        if new is not None:
            return f"{bang}[{text}]({new})"
        return f"{text} (`{target}`)"

    out, fence = [], None
    for line in readme.splitlines(keepends=True):
        marker = line.lstrip()[:3]
        if fence is None and marker in ("```", "~~~"):
            fence = marker
        elif fence is not None and marker == fence:
            fence = None
        elif fence is None:
            line = _LINK.sub(rewrite, line)
        out.append(line)
    return "".join(out)
