"""The admin routes' path syntax (gateway/admin/route_patterns.py): ``{name}``, ``{name:path}``, nothing else."""
from __future__ import annotations

import pytest

from gateway.admin.route_patterns import RoutePattern


@pytest.mark.parametrize("pattern, path, params", [
    ("/api/v1/queues", "/api/v1/queues", {}),
    ("/api/v1/queues", "/api/v1/queues/", None),
    ("/api/v1/queues/{name}", "/api/v1/queues/orders", {"name": "orders"}),
    ("/api/v1/queues/{name}", "/api/v1/queues/or%2Fders", {"name": "or/ders"}),
    ("/api/v1/queues/{name}", "/api/v1/queues/a/b", None),
    ("/api/v1/queues/{name}", "/api/v1/queues/", None),
    ("/api/v1/queues/{name}/move", "/api/v1/queues/a/move", {"name": "a"}),
    ("/api/v1/durable-subscriptions/{client_id}/{name}", "/api/v1/durable-subscriptions/c%3A1/s",
     {"client_id": "c:1", "name": "s"}),
    ("/api/v1/retained/{topic:path}", "/api/v1/retained/a/b/c", {"topic": "a/b/c"}),
    ("/api/v1/retained/{topic:path}", "/api/v1/retained/a%2Fb", {"topic": "a/b"}),
    ("/api/v1/retained/{topic:path}", "/api/v1/retained/", None),
    ("/files/{rest:path}/raw", "/files/a/b/raw", {"rest": "a/b"}),
    ("/api/v1/queues/{name}", "/api/v1/queues/%FF", {"name": "\ufffd"}),  # not UTF-8: replaced, as before
    ("/a+b/{name}", "/a+b/x", {"name": "x"}),
    ("/a+b/{name}", "/aab/x", None),
])
def test_what_a_pattern_matches_and_the_parameters_it_gives(pattern, path, params):
    compiled = RoutePattern(pattern)
    assert compiled.match(path) == params
    assert compiled.matches(path) is (params is not None)


def test_label_and_shape():
    compiled = RoutePattern("/api/v1/retained/{topic:path}")
    assert compiled.text == "/api/v1/retained/{topic:path}"
    assert compiled.label == "/api/v1/retained/{topic}"  # what /metrics counts it under
    assert compiled.shape == "/api/v1/retained/{:path}"
    assert RoutePattern("/q/{name}/x").shape == RoutePattern("/q/{id}/x").shape == "/q/{}/x"


@pytest.mark.parametrize("pattern, error", [
    ("/q/{name:int}", "unknown converter 'int'"),
    ("/q/{name}/{name}", "parameter 'name' appears twice"),
    ("/q/{name", "written {name} or {name:path}"),
    ("/q/name}", "written {name} or {name:path}"),
    ("/q/{na-me}", "written {name} or {name:path}"),
    ("/retained/(?P<topic>.+)", None),  # a regular expression is text: it matches only itself
])
def test_patterns_outside_the_syntax(pattern, error):
    if error is None:
        compiled = RoutePattern(pattern)
        assert compiled.match("/retained/a") is None and compiled.match(pattern) == {}
        return
    with pytest.raises(ValueError, match=error.replace("{", r"\{").replace("}", r"\}")):
        RoutePattern(pattern)
