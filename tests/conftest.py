from __future__ import annotations

from typing import Any, Iterator

import pytest

from tests.support import BrokerHandle, make_config


@pytest.fixture
def broker(tmp_path: Any, request: Any) -> Iterator[BrokerHandle]:
    """A fresh broker; ``@pytest.mark.policy(max_redeliveries=1, ...)`` tunes its policy."""
    marker = request.node.get_closest_marker("policy")
    policy = marker.kwargs if marker else {}
    handle = BrokerHandle(make_config(tmp_path, **policy))
    yield handle
    handle.stop()
