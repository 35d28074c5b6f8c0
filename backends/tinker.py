"""Tinker backend (planned): registered so `openclaw backends` reports on it; serving/training land later."""

from __future__ import annotations

from backends._planned import PlannedCloudBackend


class TinkerBackend(PlannedCloudBackend):
    name = "tinker"
    title = "Tinker"
    sdk_module = "tinker"
    key_env = "TINKER_API_KEY"
