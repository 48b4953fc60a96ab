"""Storage behind the core: the Store interface and its implementations."""
