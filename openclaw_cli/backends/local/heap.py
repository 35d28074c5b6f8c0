"""Giving the memory of freed tensors back to the operating system (glibc on Linux).

Training on CPU allocates and frees tensors of many sizes (a micro-batch's activations and logits scale with its
padded length), from several threads (the sampler, the trainer and the judge's scoring each run torch in a thread of
their own, and glibc gives each its own heap). glibc serves an allocation above its mmap threshold with a mapping of
its own, returned when freed, but it *raises* that threshold every time such a mapping is freed, up to 32 MB: from
then on those tensors come from the heaps, whose freed middles are kept, and a long run's resident memory ratchets
up to the sum of every thread's worst moment. Measured in the learning bench (SmolLM2-135M, 2 users, replays on):
one run reached 23 GB and was killed on a 24 GB machine (docs/learning-history.md).

:func:`keep_large_allocations_mapped` fixes the threshold (which also stops glibc moving it), so a tensor of at
least that size is always its own mapping; :func:`release_free_memory` hands freed heap pages back after a training
step. Both are no-ops where glibc is not the allocator.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from functools import cache

log = logging.getLogger("openclaw.local")

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD_BYTES = 1 << 20  # tensors of 1 MB or more: a (128, 2048) float32 activation is exactly that


@cache
def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):  # musl and others have neither call
        return None
    return libc


@cache
def keep_large_allocations_mapped() -> bool:
    """Serve every allocation of at least :data:`MMAP_THRESHOLD_BYTES` with a mapping of its own, for the rest of
    the process (once; True when glibc took it)."""
    libc = _glibc()
    ok = libc is not None and libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    log.debug("mmap threshold fixed at %d bytes: %s", MMAP_THRESHOLD_BYTES, ok)
    return ok


def release_free_memory() -> None:
    """Return the free pages of every heap to the operating system (a few milliseconds)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
