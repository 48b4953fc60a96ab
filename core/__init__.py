"""Message broker core: protocol-independent routing, queues, topics, acks."""
