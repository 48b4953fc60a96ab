"""MQTT 3.1 (MQIsdp), 3.1.1 and 5.0."""
