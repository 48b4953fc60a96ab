"""A long run of produce and consume does not grow the data directory without bound."""
from __future__ import annotations

import os

from tests.support import BrokerHandle, call, connect, disconnect, make_config, wait_until


def disk_usage(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def test_consumed_messages_give_their_space_back(tmp_path):
    config = make_config(tmp_path)
    config.persistence.compaction_deletes = 1000
    handle = BrokerHandle(config)
    try:
        producer, pgot = connect(handle, "1.2")
        consumer, cgot = connect(handle, "1.2")
        consumer.subscribe("/queue/churn", id="c", ack="auto")
        body = "y" * 2000
        rounds, per_round = 5, 2000
        for r in range(rounds):
            for i in range(per_round):
                receipt = f"r{r}" if i == per_round - 1 else None
                producer.send("/queue/churn", body, headers={"persistent": "true"}, receipt=receipt)
            pgot.wait_for(r + 1, what="receipts", timeout=30)
            cgot.wait_for((r + 1) * per_round, timeout=30)
        written = rounds * per_round * len(body)
        wait_until(lambda: handle.queue_depth("queue://churn") == 0, what="every message acked (deleted from the store)")
        assert call(handle.gateway.reclaim) is True
        store = call(lambda: handle.gateway.store)
        call(store.db.flush)
        call(store.compact)
        size = disk_usage(os.path.join(config.data_dir, "store"))
        # What is left is RocksDB's own files (logs, manifest, options), not the messages.
        assert size < written / 4, f"{size >> 10} KiB on disk after {written >> 10} KiB written and consumed"
        assert handle.queue_depth("queue://churn") == 0
        disconnect(producer)
        disconnect(consumer)
    finally:
        handle.stop()
