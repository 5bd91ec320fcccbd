"""A griffe extension: Sphinx roles in docstrings become cross-references.

The docstrings are Google style but name objects with Sphinx roles
(``:class:`~optiplug.Registry```, ``:func:`verify```). mkdocstrings would
print those roles literally; this rewrites each one, once the package is
loaded, into an optional autorefs link (a link where the name is documented
on the site, plain code elsewhere: never a warning). ``~`` shows the last
component only, as in Sphinx.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|exc|data|obj|const):`(~?)([^`]+)`")


def _identifier(obj: griffe.Object, name: str) -> str | None:
    if name.startswith(("optiplug.", "optiplug_")) or name == "optiplug":
        return name
    head, _, rest = name.partition(".")
    try:
        path = obj.resolve(head)
    except griffe.NameResolutionError:
        return None
    return f"{path}.{rest}" if rest else path


def _rewrite(obj: griffe.Object) -> None:
    docstring = obj.docstring
    if docstring is None or ":`" not in docstring.value:
        return

    def link(match: re.Match[str]) -> str:
        short, name = match.group(1) == "~", match.group(2).strip()
        shown = name.rsplit(".", 1)[-1] if short else name
        identifier = _identifier(obj, name)
        if identifier is None:
            return f"`{shown}`"
        return f'<autoref identifier="{identifier}" optional hover><code>{shown}</code></autoref>'

    docstring.value = ROLE.sub(link, docstring.value)


def _walk(obj: griffe.Object) -> None:
    _rewrite(obj)
    for member in obj.members.values():
        if not member.is_alias and member.parent is obj:
            _walk(member)  # type: ignore[arg-type]


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring of a loaded package."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        _walk(pkg)
