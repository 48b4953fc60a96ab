"""Bridges: clients inside the broker that forward messages to and from another broker.

A bridge speaks MQTT (or STOMP) to the remote with the same pure codecs the
listeners use.  What goes out waits in a durable queue of its own, fed by
durable subscriptions in the same store batch as the publish, so a message the
broker confirmed locally is forwarded even across a restart; what comes in is
acknowledged to the remote only once it is stored here.
"""
