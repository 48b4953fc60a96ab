"""Composition root: configuration, broker assembly, listeners, CLI."""
