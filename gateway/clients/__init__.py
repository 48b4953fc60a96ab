"""Programs that talk to a broker from outside, shipped with it: the operator commands and the load generator.

Nothing here runs inside ``gateway run``: ``ops`` is an HTTP client of the
admin API and ``perf`` speaks STOMP and MQTT over sockets, so either can be
pointed at any broker, as Mosquitto keeps its ``client/`` and ``apps/`` apart
from ``src/``.
"""
