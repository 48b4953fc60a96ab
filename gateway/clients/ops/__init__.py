"""Operators' commands (``gateway stat``, ``browse``, ``purge``, ...): the admin API from a shell, as ``activemq dstat`` and ``artemis queue stat``."""
