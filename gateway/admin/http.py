"""The admin listener's HTTP plumbing: a size-bounded request, JSON answers, a route table.

Every answer is JSON (or a stream format the caller asked for); every error
is ``{"error": ..., "code": ...}`` with a 4xx status, never a traceback.  A
request body larger than ``max_request_size`` is refused from its
Content-Length, before the body is read (413), or as soon as a chunked body
passes the limit.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Protocol, cast, overload

from twisted.logger import Logger
from twisted.web import http, server
from twisted.web.resource import Resource

from core.access import ANONYMOUS, Access, AllowAll, Permission, Principal, Reader, Reading
from gateway.admin.route_patterns import RoutePattern
from gateway.twisted_types import connected_transport
from persistence.store import StoreUnavailable

log = Logger(namespace="gateway.admin")


class HttpError(Exception):
    """An answer other than 2xx: status, the message a person reads, a code a program checks."""

    def __init__(self, status: int, error: str, code: str = "bad_request", **extra: Any) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.code = code
        self.extra = extra


# What a handler answers: status, headers, body.
Answer = tuple[int, dict[str, str], bytes]


def json_body(status: int, value: Any) -> Answer:
    return status, {"Content-Type": "application/json"}, json.dumps(value).encode() + b"\n"


def error_body(exc: HttpError) -> Answer:
    return json_body(exc.status, {"error": exc.error, "code": exc.code, **exc.extra})


class _AdminChannel(Protocol):
    # Site.buildProtocol sets ``site`` on each channel; twisted.web's HTTPChannel does not declare it.
    site: AdminSite


class Grant:
    """Who a request is (its principal) and what the configured rules let it do."""

    __slots__ = ("principal", "access")

    def __init__(self, principal: Principal, access: Access) -> None:
        self.principal = principal
        self.access = access

    def allowed(self, permission: Permission, destination: str) -> bool:
        return self.access.allowed(self.principal, permission, destination)


# The admin listener without [auth]: everything, as the loopback default allows.
OPEN = Grant(ANONYMOUS, AllowAll())


class _Nothing:
    def allowed(self, principal: Principal, permission: Permission, destination: str, client_id: str | None = None) -> bool:
        return False

    def reading(self, principal: Principal, destination: str, client_id: str | None = None) -> Reading:
        return Reading.REFUSED

    def reader(self, principal: Principal, client_id: str | None = None) -> Reader | None:
        return None

    @property
    def version(self) -> int:
        return 0


# A public route's request (health checks from load balancers): no credentials asked, and no permission.
PUBLIC = Grant(ANONYMOUS, _Nothing())
REALM = 'Basic realm="gateway", charset="UTF-8"'


class Guard(Protocol):
    """Authenticates a request before its handler runs (gateway/admin/auth.py)."""

    def check(self, request: server.Request, done: Callable[[Grant | HttpError], None]) -> None:
        """Call ``done`` once, on the reactor thread, now or later."""


class BoundedRequest(server.Request):
    """A request whose body may not exceed the site's ``max_request_size``."""

    _too_large = False
    _received = 0
    grant: Grant | None = None  # set by the Router once the request is authenticated
    route: str | None = None  # the pattern of the route it matched, for /metrics

    def _limit(self) -> int:
        return cast(_AdminChannel, self.channel).site.max_request_size

    def gotLength(self, length: int | None) -> None:
        if length is not None and length > self._limit():
            self._refuse(length)
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self._too_large:
            return
        self._received += len(data)
        if self._received > self._limit():
            self._refuse(self._received)
            return
        super().handleContentChunk(data)

    def _refuse(self, size: int) -> None:
        # The body is never read: answer and close, as the body cannot be skipped cheaply.
        self._too_large = True
        body = json.dumps({
            "error": f"request body of {size} bytes is over the limit of {self._limit()} ([admin] max_request_size)",
            "code": "request_too_large",
        }).encode() + b"\n"
        transport = connected_transport(self.channel.transport)
        transport.write(
            b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        transport.loseConnection()

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self._too_large:
            return
        super().requestReceived(command, path, version)


Handler = Callable[..., Any]


class Router(Resource):
    """Routes by method and path pattern; handlers return (status, headers, body) or raise HttpError.

    A handler may return a Deferred for answers that wait (a publish waits
    for its batch to be on disk).  Routes are tried in the order they were
    added; the first whose pattern matches the path answers.
    """

    isLeaf = True

    def __init__(self, guard: Guard | None = None) -> None:
        super().__init__()
        self._routes: list[tuple[RoutePattern, dict[str, Handler]]] = []
        self._public: list[RoutePattern] = []  # the routes answered without credentials
        # Answers by (route, method, status): gateway_http_requests_total (gateway/admin/metrics.py).
        self.answered: dict[tuple[str, str, int], int] = {}
        self.guard = guard
        # What answers a path no route matches (None: 404); a standby answers 503 instead.
        self.fallback: Handler | None = None

    def render(self, request: server.Request) -> Any:
        """Authenticate (at once, or after the password check), then route."""
        refusal = cross_site(request)
        if refusal is not None:
            return self._finish(request, error_body(refusal))
        if self.guard is None:
            return self._route(request, OPEN)
        if self._public and self._is_public(request):
            return self._route(request, PUBLIC)
        now: list[Grant | HttpError] = []
        waiting = False

        def done(outcome: Grant | HttpError) -> None:
            if not waiting:
                now.append(outcome)
            elif not request.finished and not getattr(request, "_disconnected", False):
                body = self._answer(request, outcome)
                if body is not server.NOT_DONE_YET:
                    _send(request, body)  # answered (and counted) by _answer; only the sending is late

        self.guard.check(request, done)
        if now:
            return self._answer(request, now[0])
        waiting = True
        return server.NOT_DONE_YET

    def _answer(self, request: server.Request, outcome: Grant | HttpError) -> Any:
        if isinstance(outcome, HttpError):
            return self._finish(request, error_body(outcome))
        return self._route(request, outcome)

    def add(self, pattern: str, *, public: bool = False, **methods: Handler) -> None:
        """Serve each method (``get=handler``, ``delete=handler``...) on the paths ``pattern`` matches.

        ``{name}`` matches one path segment, ``{name:path}`` the rest of the
        path (gateway/admin/route_patterns.py); each reaches the handler as a
        keyword argument.  A path may get its methods over several calls, but
        each method once: a second handler for the same path and method is
        two modules claiming one route, refused (ValueError) rather than one
        silently replacing the other.  ``public``: answered without
        credentials even when users are configured (health checks).
        """
        compiled = RoutePattern(pattern)
        handlers = {m.upper(): h for m, h in methods.items()}
        for route, existing in self._routes:
            if route.shape == compiled.shape:  # the same paths, maybe with other parameter names
                break
        else:
            route, existing = compiled, {}
            self._routes.append((route, existing))
        if route.text != pattern:
            raise ValueError(f"route {pattern} is routed already as {route.text}: name its parameters alike")
        for method in handlers:
            if method in existing:
                raise ValueError(f"route {method} {pattern} is registered twice")
        existing.update(handlers)
        if public and route not in self._public:
            self._public.append(route)

    def routes(self) -> list[tuple[str, dict[str, Handler]]]:
        """Every route as added, in the order they are tried: its pattern, and its handlers by method."""
        return [(route.text, dict(methods)) for route, methods in self._routes]

    def _is_public(self, request: server.Request) -> bool:
        path = request.path.decode("utf-8", "replace")
        return any(route.matches(path) for route in self._public)

    def _route(self, request: server.Request, grant: Grant) -> Any:
        if isinstance(request, BoundedRequest):
            request.grant = grant
        try:
            path = request.path.decode("utf-8")
        except UnicodeDecodeError:
            return self._finish(request, error_body(HttpError(400, "the path is not UTF-8")))
        method = request.method.decode("ascii", "replace")
        for route, methods in self._routes:
            params = route.match(path)
            if params is None:
                continue
            if isinstance(request, BoundedRequest):
                request.route = route.label
            handler = methods.get(method)
            if handler is None:
                request.setHeader("Allow", ", ".join(sorted(methods)))
                return self._finish(request, error_body(HttpError(
                    405, f"{method} is not allowed on {path}; use {', '.join(sorted(methods))}", "method_not_allowed",
                )))
            try:
                result = handler(request, **params)
            except HttpError as exc:
                return self._finish(request, error_body(exc))
            except StoreUnavailable as exc:
                # A read that needs the store's pending writes (a browse, a purge of a paged
                # queue) while the disk is full: retry once it writes again (/api/v1/ready says when).
                return self._finish(request, error_body(HttpError(503, str(exc), "store_unavailable")))
            except Exception:
                log.failure("admin request {method} {path} failed", method=method, path=path)
                return self._finish(request, error_body(HttpError(500, "internal error; see the broker's log", "internal_error")))
            if hasattr(result, "addCallbacks"):
                result.addCallbacks(
                    lambda answer: self._finish(request, answer, deferred=True),
                    lambda failure: self._failed(request, failure, method, path),
                )
                return server.NOT_DONE_YET
            return self._finish(request, result)
        if self.fallback is not None:
            try:
                return self._finish(request, self.fallback(request))
            except HttpError as exc:
                return self._finish(request, error_body(exc))
        return self._finish(request, error_body(HttpError(404, f"no such resource: {path}", "not_found")))

    def _failed(self, request: server.Request, failure: Any, method: str, path: str) -> None:
        if failure.check(HttpError):
            self._finish(request, error_body(failure.value), deferred=True)
            return
        if failure.check(StoreUnavailable):
            self._finish(request, error_body(HttpError(503, str(failure.value), "store_unavailable")), deferred=True)
            return
        log.failure("admin request {method} {path} failed", failure, method=method, path=path)
        self._finish(request, error_body(HttpError(500, "internal error; see the broker's log", "internal_error")), deferred=True)

    def _finish(self, request: server.Request, answer: Answer, deferred: bool = False) -> bytes:
        status, headers, body = answer
        if deferred and (request.finished or getattr(request, "_disconnected", False)):
            return b""  # the client left before the answer: nothing is sent, nothing counted
        self._count(request, status)
        request.setResponseCode(status)
        if status == 401:
            request.setHeader("WWW-Authenticate", REALM)
        for name, value in headers.items():
            request.setHeader(name, value)
        if status >= 400:
            log.debug("{method} {path} -> {status}", method=request.method, path=request.path, status=status)
        if deferred:
            _send(request, body)
            return b""
        return body

    def _count(self, request: server.Request, status: int) -> None:
        """One answer more for /metrics: by route pattern (bounded, unlike paths), method and status."""
        route = request.route if isinstance(request, BoundedRequest) else None
        if route is None:  # refused before routing (credentials, cross-site), or no route matches
            path = request.path.decode("utf-8", "replace")
            route = next((r.label for r, _ in self._routes if r.matches(path)), "unmatched")
        method = request.method.decode("ascii", "replace")
        key = (route, method if method in _METHODS else "other", status)
        self.answered[key] = self.answered.get(key, 0) + 1


def _send(request: server.Request, body: bytes) -> None:
    """Write a late answer (after a Deferred or a password check) and end the request."""
    request.setHeader("Content-Length", str(len(body)))
    request.write(body)
    request.finish()


# Methods counted under their own name in /metrics; any other is "other" (clients choose them freely).
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# Methods a page on another site may not make a browser send here (with its cached credentials).
_SAFE_METHODS = (b"GET", b"HEAD", b"OPTIONS")


def cross_site(request: server.Request) -> HttpError | None:
    """A change asked by a page of another origin (cross-site request forgery): refused.

    Browsers name the page's origin in ``Origin`` on every cross-origin POST,
    PUT and DELETE; the console, on this listener's own origin, matches the
    ``Host`` it was served from.  curl, the CLI and Spark send no Origin and
    are not affected.  Without this, any web page open on an operator's
    machine could purge a queue through the browser's cached Basic credentials
    or the loopback listener.
    """
    if request.method in _SAFE_METHODS:
        return None
    origin = request.getHeader("origin")
    if origin is None:
        return None
    host = request.getHeader("host") or ""
    scheme = "https" if request.isSecure() else "http"
    if origin == f"{scheme}://{host}":
        return None
    return HttpError(403, f"cross-site request refused: Origin {origin[:200]} is not this listener ({scheme}://{host[:200]})",
                     "cross_origin")


def grant_of(request: server.Request) -> Grant | None:
    return request.grant if isinstance(request, BoundedRequest) else None


def permitted(request: server.Request, permission: Permission, destination: str) -> bool:
    """Whether the request's principal may; a request the Router did not authenticate may nothing."""
    grant = grant_of(request)
    return grant is not None and grant.allowed(permission, destination)


def require(request: server.Request, permission: Permission, destination: str, where: str = "") -> None:
    """Refuse the request unless its principal has ``permission`` on ``destination``.

    An anonymous request is asked for credentials (401), an authenticated
    one is refused (403); either way nothing says whether the destination exists.
    """
    if permitted(request, permission, destination):
        return
    grant = grant_of(request)
    prefix = f"{where}: " if where else ""
    if grant is None or grant.principal.anonymous:
        raise HttpError(401, f"{prefix}{permission.value} on {destination} needs a user name and password", "unauthorized")
    raise HttpError(403, f"{prefix}user {grant.principal.name!r} may not {permission.value} {destination}", "forbidden")


def request_body(request: server.Request) -> bytes:
    """The whole body: twisted.web has read it (within max_request_size) before a handler runs."""
    content = request.content
    assert content is not None  # made by gotLength, which comes before the body and the handler
    body: bytes = content.read()
    return body


def query(request: server.Request, name: str) -> str | None:
    values: list[bytes] | None = request.args.get(name.encode())
    if not values:
        return None
    try:
        return values[-1].decode("utf-8")
    except UnicodeDecodeError:
        raise HttpError(400, f"parameter {name} is not UTF-8") from None


@overload
def int_query(request: server.Request, name: str, default: int, low: int = 0, high: int | None = None) -> int: ...


@overload
def int_query(request: server.Request, name: str, default: None, low: int = 0, high: int | None = None) -> int | None: ...


def int_query(request: server.Request, name: str, default: int | None, low: int = 0, high: int | None = None) -> int | None:
    text = query(request, name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise HttpError(400, f"parameter {name} must be an integer, got {text[:40]!r}") from None
    if value < low or (high is not None and value > high):
        bound = f"{low}-{high}" if high is not None else f"at least {low}"
        raise HttpError(400, f"parameter {name} must be {bound}, got {value}")
    return value


class AdminSite(server.Site):
    requestFactory = BoundedRequest

    def __init__(self, resource: Resource, max_request_size: int) -> None:
        super().__init__(resource)
        self.max_request_size = max_request_size
        self.displayTracebacks = False

    def log(self, request: http.Request) -> None:
        """No access log line per request: Spark polls several times a second."""
