"""A broker without streams never loads pyarrow (about 45 MiB of memory it would not use)."""
from __future__ import annotations

import subprocess
import sys


def test_no_streams_no_pyarrow():
    code = (
        "import sys\n"
        "from twisted.internet.task import Clock\n"
        "import gateway.cli, gateway.server\n"
        "from core.broker import Broker\n"
        "from persistence.memory import MemoryStore\n"
        "b = Broker(MemoryStore(), Clock())\n"
        "b.start()\n"
        "assert not b.streams.active\n"
        "print('pyarrow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_unknown_stream_without_streams():
    import pytest
    from twisted.internet.task import Clock

    from core.broker import Broker
    from core.stream_config import UnknownStream
    from persistence.memory import MemoryStore

    broker = Broker(MemoryStore(), Clock())
    broker.start()
    with pytest.raises(UnknownStream, match="unknown stream 'x'"):
        broker.streams.get("x")
