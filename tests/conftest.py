from __future__ import annotations

from typing import Any, Iterator

import pytest

from tests.support import BrokerHandle, connect, disconnect, make_config


def pytest_sessionstart(session: Any) -> None:
    """Under GATEWAY_EXPECT_COMPILED=1 (tests/system/test_compiled.py) a pure import is a failure.

    Without this check a compiled run whose extensions failed to load would pass on
    the .py files beside them and prove nothing.
    """
    import os

    if os.environ.get("GATEWAY_EXPECT_COMPILED") == "1":
        from gateway.compiled import compiled_modules

        expected = os.environ.get("GATEWAY_EXPECT_MODULES", "").split()
        loaded = compiled_modules()
        if not loaded or sorted(expected) != loaded:
            pytest.exit(f"expected compiled modules {sorted(expected)}, found {loaded}", returncode=3)


@pytest.fixture
def broker(tmp_path: Any, request: Any) -> Iterator[BrokerHandle]:
    """A fresh broker; ``@pytest.mark.policy(max_redeliveries=1, ...)`` tunes its policy."""
    marker = request.node.get_closest_marker("policy")
    policy = marker.kwargs if marker else {}
    handle = BrokerHandle(make_config(tmp_path, **policy))
    yield handle
    handle.stop()


@pytest.fixture
def client(broker: BrokerHandle) -> Iterator[Any]:
    """connect() to the test's broker, disconnecting whatever the test left open."""
    made = []

    def make(version: str = "1.2", client_id: str | None = None, **kwargs: Any) -> Any:
        conn, got = connect(broker, version, client_id, **kwargs)
        made.append(conn)
        return conn, got

    yield make
    for conn in made:
        disconnect(conn)
