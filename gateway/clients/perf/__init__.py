"""``gateway perf``: the project's load generator, usable against any STOMP or MQTT broker.

It lives in the gateway package because it ships with the broker (as Artemis
ships ``artemis perf``), but it talks to a broker only over sockets, so it
measures Mosquitto or ActiveMQ exactly as it measures this one.
"""
