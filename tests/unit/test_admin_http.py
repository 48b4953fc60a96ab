"""The admin listener's route table (``Router`` in gateway/admin/http.py) without sockets.

Requests are twisted.web's ``DummyRequest`` with the raw path a client sent,
so what a handler gets is what it would get over HTTP: the parameters as
matched on the raw path, then URL-decoded.
"""
from __future__ import annotations

import json
from typing import Any

import pytest
from twisted.web.test.requesthelper import DummyRequest

from gateway.admin.http import HttpError, Router, json_body


def request(router: Router, method: str, path: str) -> tuple[int, dict[str, Any]]:
    """One request through the router: its status and JSON answer."""
    dummy = DummyRequest([])
    dummy.method = method.encode()
    dummy.path = path.encode()
    body = router.render(dummy)
    return dummy.responseCode, json.loads(body)


def echo(request: Any, **params: str) -> Any:
    return json_body(200, params)


# -- one (path, method) has one handler -----------------------------------------------------


def test_the_same_path_and_method_twice_is_refused():
    router = Router()
    router.add("/api/v1/queues/{name}", get=echo)
    with pytest.raises(ValueError, match=r"GET /api/v1/queues/\{name\} is registered twice"):
        router.add("/api/v1/queues/{name}", get=lambda request, name: json_body(200, {"replaced": True}))
    assert request(router, "GET", "/api/v1/queues/orders") == (200, {"name": "orders"})  # the first still answers


def test_the_method_is_compared_whatever_its_case():
    router = Router()
    router.add("/metrics", get=echo)
    with pytest.raises(ValueError, match="GET /metrics"):
        router.add("/metrics", GET=echo)


def test_a_refused_call_adds_none_of_its_methods():
    router = Router()
    router.add("/api/v1/queues/{name}", delete=echo)
    with pytest.raises(ValueError, match="DELETE"):
        router.add("/api/v1/queues/{name}", put=echo, delete=echo)
    assert router.routes() == [("/api/v1/queues/{name}", {"DELETE": echo})]


def test_another_method_on_a_known_path_joins_its_route():
    router = Router()
    router.add("/api/v1/queues/{name}", get=echo)
    router.add("/api/v1/queues/{name}", delete=lambda request, name: json_body(200, {"deleted": name}))
    assert [(pattern, sorted(methods)) for pattern, methods in router.routes()] == [
        ("/api/v1/queues/{name}", ["DELETE", "GET"]),
    ]
    assert request(router, "GET", "/api/v1/queues/a") == (200, {"name": "a"})
    assert request(router, "DELETE", "/api/v1/queues/a") == (200, {"deleted": "a"})
    status, error = request(router, "POST", "/api/v1/queues/a")
    assert status == 405 and error["code"] == "method_not_allowed" and "use DELETE, GET" in error["error"]


def test_one_path_under_two_parameter_names_is_refused():
    """Both would match the same paths, and the second's handlers would never be reached."""
    router = Router()
    router.add("/api/v1/queues/{name}", get=echo)
    with pytest.raises(ValueError, match=r"/api/v1/queues/\{id\} is routed already as /api/v1/queues/\{name\}"):
        router.add("/api/v1/queues/{id}", delete=echo)


def test_a_bad_pattern_is_refused_when_added():
    router = Router()
    with pytest.raises(ValueError, match="unknown converter 'int'"):
        router.add("/api/v1/queues/{name:int}", get=echo)
    with pytest.raises(ValueError, match="written"):
        router.add("/api/v1/queues/{name", get=echo)
    assert router.routes() == []


def test_the_admin_listener_registers_each_route_once():
    """Building the real site raises if two modules claim one (path, method)."""
    from twisted.internet.task import Clock

    from core.broker import Broker
    from gateway.admin import admin_site
    from persistence.memory import MemoryStore

    routes = admin_site(Broker(MemoryStore(), Clock()), 1 << 20, "0").resource.routes()
    patterns = [pattern for pattern, _ in routes]
    assert len(patterns) == len(set(patterns))
    assert ("/api/v1/retained/{topic:path}", ["DELETE"]) in [(p, sorted(m)) for p, m in routes]


# -- {name} and {name:path} ------------------------------------------------------------------------


def test_a_name_is_one_segment_url_decoded():
    router = Router()
    router.add("/api/v1/queues/{name}", get=echo)
    router.add("/api/v1/queues/{name}/purge", post=echo)
    assert request(router, "GET", "/api/v1/queues/orders.eu") == (200, {"name": "orders.eu"})
    assert request(router, "GET", "/api/v1/queues/a%2Fb%20c") == (200, {"name": "a/b c"})  # %2F stays in its segment
    assert request(router, "GET", "/api/v1/queues/%C3%A9t%C3%A9") == (200, {"name": "été"})
    assert request(router, "POST", "/api/v1/queues/a%2Fb/purge") == (200, {"name": "a/b"})
    assert request(router, "GET", "/api/v1/queues/a/b")[0] == 404
    assert request(router, "GET", "/api/v1/queues/")[0] == 404


def test_a_path_parameter_takes_the_rest_of_the_path():
    router = Router()
    router.add("/api/v1/retained", get=echo)
    router.add("/api/v1/retained/{topic:path}", delete=echo)
    assert request(router, "DELETE", "/api/v1/retained/a/b/c") == (200, {"topic": "a/b/c"})
    assert request(router, "DELETE", "/api/v1/retained/a%2Fb%2Fc") == (200, {"topic": "a/b/c"})  # encoded: the same
    assert request(router, "DELETE", "/api/v1/retained/topic://a.b") == (200, {"topic": "topic://a.b"})
    assert request(router, "DELETE", "/api/v1/retained/a/%2B") == (200, {"topic": "a/+"})
    assert request(router, "GET", "/api/v1/retained") == (200, {})
    assert request(router, "DELETE", "/api/v1/retained/")[0] == 404  # the rest of the path, but not nothing
    assert request(router, "GET", "/api/v1/retained/a/b")[0] == 405


def test_literal_text_in_a_pattern_is_literal():
    router = Router()
    router.add("/api/v1.x/{name}", get=echo)
    assert request(router, "GET", "/api/v1.x/a") == (200, {"name": "a"})
    assert request(router, "GET", "/api/v1-x/a")[0] == 404  # a "." in a pattern is no wildcard


def test_answers_are_counted_under_the_pattern_without_its_converter():
    """``/metrics`` labels (``route``) stay as they were: ``{topic}``, not ``{topic:path}``."""
    router = Router()
    router.add("/api/v1/retained/{topic:path}", delete=echo)
    request(router, "DELETE", "/api/v1/retained/a/b")
    request(router, "GET", "/api/v1/retained/a/b")
    request(router, "GET", "/nowhere")
    assert router.answered == {
        ("/api/v1/retained/{topic}", "DELETE", 200): 1,
        ("/api/v1/retained/{topic}", "GET", 405): 1,
        ("unmatched", "GET", 404): 1,
    }


def test_handlers_errors_are_json():
    router = Router()

    def refuse(request: Any, name: str) -> Any:
        raise HttpError(409, f"{name} is busy", "busy", name=name)

    router.add("/things/{name}", post=refuse)
    assert request(router, "POST", "/things/x") == (409, {"error": "x is busy", "code": "busy", "name": "x"})
