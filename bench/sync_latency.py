#!/usr/bin/env python3
"""The cost of one durable small write on this machine's disk, the floor under
a one-client commit: an 8 KiB pwrite then fdatasync, 2,000 times, first
appending to a new file (each sync also writes the file's new size), then
overwriting the same 2,000 blocks in place (what a reused SQLite WAL does).

    python3 bench/sync_latency.py [DIR] [COUNT]

DIR (default: the system's temporary directory) must be on the disk to
measure. Prints p50, p90 and p99 in microseconds for each."""
import os
import sys
import tempfile
import time


def measure(fd, count, block):
    latencies = []
    for i in range(count):
        start = time.perf_counter_ns()
        os.pwrite(fd, block, i * len(block))
        os.fdatasync(fd)
        latencies.append((time.perf_counter_ns() - start) / 1000)
    latencies.sort()
    return [latencies[int(len(latencies) * q)] for q in (0.5, 0.9, 0.99)]


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else tempfile.gettempdir()
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    block = b"x" * 8192
    path = os.path.join(directory, "tidemark-sync-latency.%d" % os.getpid())
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    try:
        for name in ("append", "overwrite"):
            p50, p90, p99 = measure(fd, count, block)
            print("%-9s p50 %4.0f us  p90 %4.0f us  p99 %4.0f us  (%d x 8 KiB pwrite + fdatasync)"
                  % (name, p50, p90, p99, count))
    finally:
        os.close(fd)
        os.unlink(path)


if __name__ == "__main__":
    main()
