#!/usr/bin/env python3
"""Pages each commit wrote, read from a SQLite WAL file's frame headers.

    python3 bench/wal_frames.py DATA/consensus.db-wal

Each WAL frame is a 24-byte header (the page number, then the database
size in pages, non-zero only on a commit's last frame, then the salts)
and one page. Frames of the WAL's current generation (those whose salts
match the file header's) are grouped into commits; prints how many
commits wrote how many pages, the average, and the pages written most.
Copy the WAL first if a process is still writing it.
"""
import collections
import struct
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    data = open(sys.argv[1], "rb").read()
    if len(data) < 32:
        sys.exit("%s: not a WAL file (too short)" % sys.argv[1])
    page_size = struct.unpack(">I", data[8:12])[0]
    salts = data[16:24]
    commits, current, offset = [], [], 32
    while offset + 24 + page_size <= len(data):
        page, size_after = struct.unpack(">II", data[offset:offset + 8])
        if data[offset + 8:offset + 16] != salts:
            break  # an older generation's frames follow
        current.append(page)
        if size_after:
            commits.append(current)
            current = []
        offset += 24 + page_size
    if not commits:
        sys.exit("%s: no commit in the current generation" % sys.argv[1])
    frames = sum(len(c) for c in commits)
    print("page size %d, %d commits, %d frames, %.2f pages a commit" %
          (page_size, len(commits), frames, frames / len(commits)))
    sizes = collections.Counter(len(c) for c in commits)
    for pages, count in sorted(sizes.items()):
        print("  %2d page(s): %d commits (%.0f%%)" % (pages, count, 100 * count / len(commits)))
    hot = collections.Counter(p for c in commits for p in c).most_common(8)
    print("pages written most: " + ", ".join("%d x%d" % (p, n) for p, n in hot))


if __name__ == "__main__":
    main()
