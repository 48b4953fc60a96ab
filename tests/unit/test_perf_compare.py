"""The summary of ``gateway perf --against-plain``: ratios within rounds, CPU added and where."""
from __future__ import annotations

from gateway.clients.perf.compare import Pair, Summary, table
from gateway.clients.perf.scenarios import Result


def result(figure: float, cpu: float | None, threads: dict[str, float] | None = None, verified: bool = True) -> Result:
    details = {"broker_threads_cpu_s": threads} if threads is not None else {}
    return Result("mqtt-qos0", figure, "msgs/s", verified, 1_000_000, 1_000_000, 1.0, 0.1, cpu, details)


def test_the_ratio_is_the_median_of_each_rounds_pair_not_of_the_medians():
    # The machine slowed down between rounds: each round's pair still says 0.8,
    # where the medians of each side alone (200k and 120k) would say 0.6.
    summary = Summary("mqtt-qos0", [
        Pair(result(250_000, 4.0), result(200_000, 5.0)),
        Pair(result(200_000, 5.0), result(160_000, 6.5)),
        Pair(result(100_000, 8.0), result(80_000, 9.0)),
    ])
    out = summary.as_json()
    assert out["verified"] and out["rounds"] == 3
    assert out["ratio_median"] == 0.8 and out["ratio_range"] == [0.8, 0.8]
    assert out["plain_median"] == 200_000 and out["stream_median"] == 160_000
    assert out["ratio_target"] == 0.85
    # CPU a message: 4 -> 5, 5 -> 6.5, 8 -> 9 us; the added part is the median of each round's difference.
    assert out["plain_cpu_us"] == 5.0 and out["stream_cpu_us"] == 6.5 and out["added_cpu_us"] == 1.0


def test_the_cpu_added_is_split_by_thread():
    plain = {"main": 4.0, "rocksdb": 0.0, "other": 0.0}
    stream = {"main": 4.8, "rocksdb": 0.12, "other": 0.1}
    out = Summary("mqtt-qos0", [Pair(result(200_000, 4.0, plain), result(170_000, 5.02, stream))]).as_json()
    assert out["added_cpu_us_by_thread"] == {"main": 0.8, "rocksdb": 0.12, "other": 0.1}
    lines = table([Summary("mqtt-qos0", [Pair(result(200_000, 4.0, plain), result(170_000, 5.02, stream))])])
    assert "0.85 (0.85-0.85)" in lines and "+1.02 (<= 0.4)" in lines and "main +0.80 rocksdb +0.12 other +0.10" in lines


def test_a_round_that_lost_messages_is_left_out_and_the_summary_is_not_verified():
    summary = Summary("stomp-queue", [
        Pair(result(100_000, 7.0), result(90_000, 8.0)),
        Pair(result(100_000, 7.0), result(10_000, 8.0, verified=False)),
    ])
    out = summary.as_json()
    assert not out["verified"] and out["ratio_median"] == 0.9  # from the good round only
    nothing = Summary("stomp-queue", [Pair(result(100_000, 7.0), result(1, None, verified=False))]).as_json()
    assert not nothing["verified"] and "ratio_median" not in nothing
    assert "a round lost messages" in table([Summary("stomp-queue", [Pair(result(1, 1.0), result(1, 1.0, verified=False))])])


def test_a_broker_whose_cpu_could_not_be_read_gives_ratios_without_cpu():
    out = Summary("mqtt-qos1", [Pair(result(140_000, None), result(80_000, None))]).as_json()
    assert out["ratio_median"] == round(80 / 140, 3) and out["ratio_target"] == 0.6
    assert "added_cpu_us" not in out and "added_cpu_us_by_thread" not in out
