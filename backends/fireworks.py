"""Fireworks backend (planned): registered so `openclaw backends` reports on it; serving/training land later."""

from __future__ import annotations

from backends._planned import PlannedCloudBackend


class FireworksBackend(PlannedCloudBackend):
    name = "fireworks"
    title = "Fireworks"
    sdk_module = "fireworks"
    key_env = "FIREWORKS_API_KEY"
