"""The local backend's allocator setting (openclaw_cli/backends/local/heap.py): freed tensors go back to the OS."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# The ratchet, made deterministic: a raised mmap threshold (what glibc does by itself after freeing a large block;
# set here to its 32 MB ceiling) puts 2 MB tensors on the heap; small long-lived tensors allocated between them pin
# the heap, so freeing the large ones leaves holes glibc keeps. Then either remedy of heap.py: the threshold fixed at
# 1 MB before allocating, or the heaps trimmed after freeing.
PROBE = textwrap.dedent(
    """
    import ctypes
    import sys
    import torch
    from openclaw_cli.backends.local.heap import M_MMAP_THRESHOLD, keep_large_allocations_mapped, release_free_memory

    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    assert ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 32 * 2**20) == 1
    if sys.argv[1] == "threshold":
        assert keep_large_allocations_mapped()
    start = rss_mb()
    keep = []
    chunks = []
    for i in range(200):
        chunks.append(torch.ones(2**19))
        keep.append(torch.ones(2**14))  # 64 KB: too large for a free list, carved from the heap top
    del chunks
    if sys.argv[1] == "trim":
        release_free_memory()
    print(f"{sys.argv[1]}: {rss_mb() - start:.0f} MB still resident after freeing 400 MB")
    """
)


def kept_mb(mode: str, tmp_path: Path) -> int:
    script = tmp_path / "heap_probe.py"
    script.write_text(PROBE)
    done = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split(": ")[1].split()[0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator only")
def test_freed_activation_sized_tensors_are_given_back_by_either_setting(tmp_path: Path) -> None:
    assert kept_mb("neither", tmp_path) > 300  # the ratchet: freed, but still resident
    assert kept_mb("threshold", tmp_path) < 50  # of 400 MB allocated and freed
    assert kept_mb("trim", tmp_path) < 50
