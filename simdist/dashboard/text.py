"""Text from simdist (errors, notes, assumptions) shown on the page as written.

Streamlit renders the body of ``st.error``, ``st.caption``, ``st.markdown`` and friends as
Markdown (with its own ``:color[...]``, ``:material/...:`` and ``$...$`` extensions), so a
message such as "tp*pp*cp = 24" would lose its asterisks and set "pp" in italics. Every message
that comes from data goes through :func:`md_escape` first. Pure, no Streamlit.
"""

from __future__ import annotations

import re

# CommonMark escapes any ASCII punctuation with a backslash; these are the ones Markdown, GFM
# (tables, strikethrough, autolinks) or Streamlit's extensions (":", "$", "[") give a meaning to.
_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~:$&])")


def md_escape(text: object) -> str:
    """``text`` with every Markdown-significant character backslash-escaped (newlines kept as
    hard line breaks)."""
    return _SPECIAL.sub(r"\\\1", str(text)).replace("\n", "  \n")


def plural(n: int, one: str, many: str | None = None) -> str:
    """'1 measurement', '2 measurements' (with thousands separators)."""
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def md_unescape(text: str) -> str:
    """The text :func:`md_escape` was given (for tests and logs)."""
    return re.sub(r"\\([\\`*_{}\[\]()<>#+\-.!|~:$&])", r"\1", text.replace("  \n", "\n"))
