from __future__ import annotations

import logging
from typing import Iterator

import pytest


@pytest.fixture(autouse=True)
def _quiet_stomp_py() -> Iterator[None]:
    """stomp.py logs every connection a kill cuts as a warning; in these tests the figures are what matter."""
    logger = logging.getLogger("stomp.py")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)
