"""How long does `llmgw mirror fetch` spend re-hashing a model that is already on the node?

Prints sha256 throughput of ``llmgw.mirror.transfer.hash_file`` over a temporary
file (page-cache warm, so this is the CPU bound) and what that means for a
100 GB model. Run: ``.venv/bin/python bench/mirror_hash.py [MiB]``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from llmgw.mirror.settings import MirrorSettings
from llmgw.mirror.transfer import hash_file


def main() -> None:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    chunk = MirrorSettings().chunk_size
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "blob"
        block = os.urandom(1024 * 1024)
        with open(path, "wb") as fh:
            for _ in range(mib):
                fh.write(block)
        hash_file(path, chunk)  # warm the page cache
        start = time.perf_counter()
        hash_file(path, chunk)
        elapsed = time.perf_counter() - start
    rate = mib / elapsed
    print(f"sha256 of {mib} MiB: {elapsed:.2f}s, {rate:.0f} MiB/s (chunk {chunk // 1024} KiB)")
    print(f"re-verifying a 100 GB model at this rate: {100 * 1024 / rate / 60:.1f} min on one core")


if __name__ == "__main__":
    main()
