#!/usr/bin/env python3
"""WAL pages per commit of two consensus table layouts, in SQLite itself.

    python3 bench/wal_layouts.py [--commits N] [--shards S] [--row-bytes B]

Replays what the embedded consensus does to SQLite under a one-record
append load: each commit reads a shard's head and inserts its next
version (a row of B bytes, about what a small append's state diff
encodes to); every 20th version of a shard is followed by a commit that
truncates that shard's versions below head - 10, as garbage collection
does. Shards take turns. Both layouts run in WAL mode with
synchronous=FULL in a scratch directory, and the pages each commit wrote
are read from the WAL's frame headers (bench/wal_frames.py):

  index  the layout Tidemark uses: one WITHOUT ROWID table keyed by
         (shard_key, seqno), an index b-tree
  rowid  a shard table mapping each key to a small id, and versions in a
         rowid table whose rowid is id << 40 | seqno, so a shard's
         versions are appended within its own range of rowids
"""
import argparse
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run(layout, commits, shards, row_bytes, scratch):
    path = os.path.join(scratch, layout + ".db")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("PRAGMA wal_autocheckpoint=0")
    names = ["s%04d" % i for i in range(shards)]
    if layout == "index":
        db.execute("CREATE TABLE c(shard_key TEXT NOT NULL, seqno INTEGER NOT NULL, "
                   "data BLOB NOT NULL, PRIMARY KEY(shard_key, seqno)) WITHOUT ROWID")
    else:
        db.execute("CREATE TABLE s(shard_key TEXT PRIMARY KEY, id INTEGER NOT NULL UNIQUE)")
        db.execute("CREATE TABLE v(id INTEGER PRIMARY KEY, data BLOB NOT NULL)")
        for i, name in enumerate(names):
            db.execute("INSERT INTO s VALUES(?, ?)", (name, i))
    seqnos = [0] * shards
    rows = random.Random(1)
    # Measure the second half, after a checkpoint, so the WAL holds one
    # generation of steady-state commits.
    for i in range(commits):
        if i == commits // 2:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        s = i % shards
        seqnos[s] += 1
        data = rows.randbytes(row_bytes)
        db.execute("BEGIN IMMEDIATE")
        if layout == "index":
            db.execute("SELECT seqno FROM c WHERE shard_key = ? ORDER BY seqno DESC LIMIT 1",
                       (names[s],)).fetchall()
            db.execute("INSERT INTO c VALUES(?, ?, ?)", (names[s], seqnos[s], data))
        else:
            (sid,) = db.execute("SELECT id FROM s WHERE shard_key = ?", (names[s],)).fetchone()
            base = sid << 40
            db.execute("SELECT id FROM v WHERE id >= ? AND id < ? ORDER BY id DESC LIMIT 1",
                       (base, base + (1 << 40))).fetchall()
            db.execute("INSERT INTO v VALUES(?, ?)", (base + seqnos[s], data))
        db.execute("COMMIT")
        if seqnos[s] % 20 == 0:
            db.execute("BEGIN IMMEDIATE")
            if layout == "index":
                db.execute("DELETE FROM c WHERE shard_key = ? AND seqno < ?",
                           (names[s], seqnos[s] - 10))
            else:
                db.execute("DELETE FROM v WHERE id >= ? AND id < ?",
                           (s << 40, (s << 40) + seqnos[s] - 10))
            db.execute("COMMIT")
    wal = os.path.join(scratch, layout + ".wal-copy")
    shutil.copy(path + "-wal", wal)
    db.close()
    out = subprocess.run([sys.executable, os.path.join(HERE, "wal_frames.py"), wal],
                         capture_output=True, text=True, check=True).stdout
    return out.splitlines()[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--row-bytes", type=int, default=400)
    args = parser.parse_args()
    if args.commits < 2 or args.shards < 1 or args.row_bytes < 1:
        sys.exit("wal_layouts.py: --commits >= 2, --shards >= 1, --row-bytes >= 1")
    scratch = tempfile.mkdtemp(prefix="tidemark-wal-layouts-")
    try:
        for layout in ("index", "rowid"):
            print("%-5s %d shard(s), %d-byte rows: %s" %
                  (layout, args.shards, args.row_bytes,
                   run(layout, args.commits, args.shards, args.row_bytes, scratch)))
    finally:
        shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
