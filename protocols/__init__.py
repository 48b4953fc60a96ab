"""Wire protocols: each a pure codec, a session state machine and a thin Twisted adapter."""
