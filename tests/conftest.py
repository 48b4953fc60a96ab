from __future__ import annotations

from typing import Any, Iterator

import pytest

from tests.support import BrokerHandle, connect, disconnect, make_config


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
