"""Whether a host is this machine: the bind rule (serve, launch, the CLI's own refusal) and the clients that skip
proxy environment variables for local servers all ask it. Its own module so the CLI can ask without importing the
proxy."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``, bracketed or not); any other name may
    resolve anywhere, so it is not."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
