"""MQTT over TCP: the shared stream adapter driving an MqttSession of the hub."""
from __future__ import annotations

from protocols.adapter import ConnectionGuard, SessionFactory
from protocols.mqtt.hub import MqttHub
from protocols.mqtt.session import MqttSession


def mqtt_factory(hub: MqttHub, guard: ConnectionGuard | None = None) -> SessionFactory:
    return SessionFactory(lambda transport, remote: MqttSession(hub, transport, remote), guard)
