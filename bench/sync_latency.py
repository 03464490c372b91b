#!/usr/bin/env python3
"""What this machine's disk gives one synced write, for comparison with the
one-client rows of bench/peers: N rounds of a 4 KiB pwrite over a
preallocated file followed by fdatasync, as one commit of a write-ahead log
does at best.

    python3 bench/sync_latency.py [--dir DIR] [--rounds N]

Prints p50, p90, p99 and max in milliseconds. The file (4 MiB) is created
in DIR (default: the current directory) and removed at the end.
"""
import argparse
import os
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default=".")
    parser.add_argument("--rounds", type=int, default=3000)
    args = parser.parse_args()
    path = os.path.join(args.dir, ".sync-latency-%d" % os.getpid())
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        slots = 1024
        os.pwrite(fd, b"x" * 4096 * slots, 0)
        os.fsync(fd)  # allocated and on disk: later writes overwrite in place
        page = b"y" * 4096
        took = []
        for i in range(args.rounds):
            start = time.perf_counter()
            os.pwrite(fd, page, (i % slots) * 4096)
            os.fdatasync(fd)
            took.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        os.unlink(path)
    took.sort()

    def at(q):
        return took[min(len(took) - 1, int(q * len(took)))] * 1000

    print("4 KiB pwrite + fdatasync, %d rounds: p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.3f ms"
          % (len(took), at(0.50), at(0.90), at(0.99), took[-1] * 1000))


if __name__ == "__main__":
    main()
