"""How many cores one thread's torch ops use, set for that thread alone.

While other threads run torch beside the sampler (the trainer, the judge's scoring), decoding a small model is
faster on fewer cores: on 2 cores with the trainer busy, SmolLM2-135M decoded one request as fast on one core as on
two, and a batch of four 27% faster on one (93 against 127 ms a step), because libgomp then has more worker threads
than cores, stops spinning between parallel regions, and every one of the ~200 small matrix products of a decode
step pays a futex wake-up. Prefill is arithmetic-bound and wants every core. So the sampler switches its own thread
between the counts.

``torch.set_num_threads`` cannot do that: besides the calling thread it changes the count every thread started later
takes on its first parallel op. libgomp's own ``omp_set_num_threads`` changes only the calling thread's count, and
torch reads that count (``torch.get_num_threads`` is ``omp_get_max_threads``). Where torch does not run on the
libgomp it ships (other platforms), :func:`per_thread_setter` returns None and the counts stay as they are.

The fewer decode threads only pay while other torch work runs beside decoding. Alone, decode steps are faster on
every core: SmolLM2-135M through the sampler on this quiet 2-core machine, 128 greedy tokens, 23.9-26.6 tokens/s on
both cores against 16.6-18.0 on one (four requests: 60-70 against 36-38). So the sampler asks :class:`OtherWork`
before each step: all cores while no training pass or scoring pass runs (always under ``openclaw serve``, which does
not train), ``local.decode_threads`` while one does.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path


@cache
def per_thread_setter() -> Callable[[int], None] | None:
    """``n -> None`` setting the calling thread's intra-op thread count, or None where that is not available."""
    import torch

    libraries = sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))
    if not libraries:
        return None
    try:
        gomp = ctypes.CDLL(str(libraries[0]))  # the copy torch already loaded: dlopen hands back the same one
        setter = gomp.omp_set_num_threads
    except (OSError, AttributeError):
        return None
    setter.argtypes = [ctypes.c_int]
    setter.restype = None
    return lambda n: setter(max(1, int(n)))


def default_decode_threads(all_threads: int) -> int:
    """Half of torch's thread count (at least one), for decode steps while other torch work runs: decode is
    bandwidth-bound, and the other half serves training and the judge. torch's count already follows the process's
    CPU affinity."""
    return max(1, all_threads // 2)


class OtherWork:
    """How many torch passes besides serving (training steps, scoring passes) are running now; thread-safe."""

    def __init__(self) -> None:
        self._running = 0
        self._lock = threading.Lock()

    @property
    def busy(self) -> bool:
        return self._running > 0

    @contextmanager
    def running(self) -> Iterator[None]:
        with self._lock:
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
