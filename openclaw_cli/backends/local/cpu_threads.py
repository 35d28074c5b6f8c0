"""How many cores one thread's torch ops use, set for that thread alone.

Decoding a small model on CPU is bound by memory bandwidth, not arithmetic: on 2 cores SmolLM2-135M decoded one
request as fast on one core as on two, and a batch of four 27% faster on one (93 against 127 ms a step), because
with several threads running torch (the sampler, the trainer, the judge's scoring) libgomp has more worker threads
than cores, stops spinning between parallel regions, and every one of the ~200 small matrix products of a decode
step pays a futex wake-up. Prefill is arithmetic-bound and wants every core. So the sampler switches its own thread
between the two counts.

``torch.set_num_threads`` cannot do that: besides the calling thread it changes the count every thread started later
takes on its first parallel op. libgomp's own ``omp_set_num_threads`` changes only the calling thread's count, and
torch reads that count (``torch.get_num_threads`` is ``omp_get_max_threads``). Where torch does not run on the
libgomp it ships (other platforms), :func:`per_thread_setter` returns None and the counts stay as they are.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
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
    """Half of torch's thread count (at least one): decode is bandwidth-bound, and the other half serves training
    and the judge, which run at the same time. torch's count already follows the process's CPU affinity."""
    return max(1, all_threads // 2)
