"""The admin routes' path syntax: ``/api/v1/queues/{name}``, ``/api/v1/retained/{topic:path}``.

``{name}`` matches one path segment; ``{name:path}`` matches the rest of the
path, slashes included (an MQTT topic such as ``sensors/room1``).  Everything
else in a pattern is literal: there are no regular expressions in routes, so
a pattern reads as the paths it serves, and the route list in
docs/operations.rst can be checked against the router.

A pattern is matched against the raw path, and each parameter is
percent-decoded after (as UTF-8, undecodable bytes replaced): ``%2F`` in a
``{name}`` stays inside its one segment, and a ``{name:path}`` reads the same
whether its slashes came encoded or not.
"""
from __future__ import annotations

import re
from urllib.parse import unquote

# A parameter: ``{name}`` or ``{name:converter}``.
_PARAMETER = re.compile(r"\{(\w+)(?::(\w+))?\}")
# What each converter matches of the raw path: one segment, or the rest of the path.
_CONVERTERS = {None: "[^/]+", "path": ".+"}


class RoutePattern:
    """One route's pattern, compiled: what it matches, its label in /metrics, its shape."""

    __slots__ = ("text", "regex", "label", "shape")

    def __init__(self, text: str) -> None:
        """Raises ValueError for a pattern that is not in the syntax (an unknown converter, a stray brace)."""
        if "{" in _PARAMETER.sub("", text) or "}" in _PARAMETER.sub("", text):
            raise ValueError(f"route {text}: a parameter is written {{name}} or {{name:path}}")
        regex: list[str] = []
        label: list[str] = []
        shape: list[str] = []
        names: set[str] = set()
        at = 0
        for match in _PARAMETER.finditer(text):
            literal = text[at:match.start()]
            name, converter = match.group(1), match.group(2)
            if converter not in _CONVERTERS:
                raise ValueError(f"route {text}: unknown converter {converter!r} (there is path)")
            if name in names:
                raise ValueError(f"route {text}: parameter {name!r} appears twice")
            names.add(name)
            regex += [re.escape(literal), f"(?P<{name}>{_CONVERTERS[converter]})"]
            label += [literal, f"{{{name}}}"]
            shape += [literal, "{:path}" if converter else "{}"]
            at = match.end()
        rest = text[at:]
        self.text = text
        self.regex = re.compile("^" + "".join(regex) + re.escape(rest) + "$")
        # Its label in /metrics: the pattern without converters, the same as before converters existed.
        self.label = "".join(label) + rest
        # The paths it matches, whatever its parameters are called: two patterns of one shape are one route.
        self.shape = "".join(shape) + rest

    def matches(self, path: str) -> bool:
        return self.regex.match(path) is not None

    def match(self, path: str) -> dict[str, str] | None:
        """The parameters of ``path`` (raw, as received) by name, percent-decoded; None if it does not match."""
        found = self.regex.match(path)
        if found is None:
            return None
        return {name: unquote(value) for name, value in found.groupdict().items()}
