"""How values are stored: token ids and log-probabilities as packed little-endian arrays, JSON strictly."""

from __future__ import annotations

import json
import math
import struct
import sys
from array import array
from collections.abc import Sequence
from typing import Any

_LITTLE = sys.byteorder == "little"
if array("i").itemsize != 4:  # pragma: no cover - every platform we support has 4-byte C ints
    raise ImportError("openclaw_cli.store needs a platform with 4-byte C int")


def pack_ints(values: Sequence[int]) -> bytes:
    """int32 little-endian (struct packs a list about three times faster than array does)."""
    return struct.pack(f"<{len(values)}i", *values)


def unpack_ints(blob: bytes) -> list[int]:
    return _unpack(blob, "i")


def pack_floats(values: Sequence[float]) -> bytes:
    """float64 little-endian: lossless, so stored log-probs are exactly what the sampler reported."""
    return struct.pack(f"<{len(values)}d", *values)


def unpack_floats(blob: bytes) -> list[float]:
    return _unpack(blob, "d")


def _unpack(blob: bytes, typecode: str) -> list[Any]:
    data = array(typecode)
    data.frombytes(blob)
    if not _LITTLE:  # pragma: no cover
        data.byteswap()
    return data.tolist()


def dumps_json(value: Any) -> str:
    """Strict JSON: a non-finite float (e.g. a loss the backend did not compute, NaN) is stored as null, since
    ``NaN`` / ``Infinity`` are not JSON and other readers of the store would reject them."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:
        if "Out of range float" not in str(exc):  # e.g. a circular value: not ours to repair
            raise
        return json.dumps(_finite_or_null(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _finite_or_null(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(v) for v in value]
    return value


def loads_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)
