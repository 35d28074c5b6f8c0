"""Data files shipped with openclaw-cli (read with importlib.resources)."""
