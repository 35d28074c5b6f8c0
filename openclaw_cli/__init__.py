"""openclaw-cli: a learning policy behind a local OpenAI/Anthropic-compatible proxy."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION_NAME = "openclaw-cli"

try:
    __version__ = version(DISTRIBUTION_NAME)
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["DISTRIBUTION_NAME", "__version__"]
