#!/usr/bin/env python3
"""Where a one-client request's time goes, from the server's system calls:
reads a `perf trace` of `tidemark serve` taken while one client appends
(one request at a time on one connection), cuts it into requests (from the
read that brings a request to the send of its answer), and prints:

  - the requests' latency (p50, p90, p99) as the server saw it;
  - the calls made inside the slowest 2% of requests and inside the faster
    half, per request, with their time;
  - what set each slow request apart: a checkpoint of SQLite's log (writes
    to the database file itself), a sync over 1 ms, several syncs, files
    made or renamed;
  - the log frames written per commit and the sync's time for each count.

Take the trace with (PID: the server's; the client runs meanwhile):

    perf trace -T -p PID -o TRACE -e fdatasync,fsync,pwrite64,recvfrom,sendto,openat,rename,renameat2,unlink -- sleep 5

then run `python3 bench/request_trace.py TRACE [WAL_FD DB_FD]`. The
connection is the descriptor with the most reads; SQLite's log and database
file are the descriptors given (by default the one with the most 24-byte
writes, which are frame headers, and the one with the most other writes).
perf trace slows every call it reports, so compare figures within a trace,
not with untraced runs."""
import collections
import re
import sys

LINE = re.compile(r'\s*([\d.]+) \(\s*([\d.]+) ms\): \S+/(\d+)\s+'
                  r'(?:\.\.\. \[continued\]: )?(\w+)\((.*)\)\s+= (.*)$')
FD = re.compile(r'fd: (\d+)')


def parse(path):
    """Completed calls, by start time: (start_ms, duration_ms, tid, name, fd, args, result)."""
    calls = []
    unfinished = {}  # tid -> fd of a call whose end comes on a later line
    with open(path) as trace:
        for line in trace:
            head = re.match(r'\s*[\d.]+ \(\s*\): \S+/(\d+)\s+\w+\((.*)', line)
            if head:
                fd = FD.search(head.group(2))
                unfinished[int(head.group(1))] = int(fd.group(1)) if fd else None
                continue
            match = LINE.match(line)
            if not match:
                continue
            start, duration, tid, name, args, result = match.groups()
            tid = int(tid)
            fd = FD.search(args)
            fd = int(fd.group(1)) if fd else unfinished.pop(tid, None)
            calls.append((float(start), float(duration), tid, name, fd, args, result.strip()))
    calls.sort()
    return calls


def percentile(values, fraction):
    return values[min(len(values) - 1, int(len(values) * fraction))]


def main():
    if len(sys.argv) not in (2, 4):
        sys.exit(__doc__)
    calls = parse(sys.argv[1])
    reads = collections.Counter(c[4] for c in calls if c[3] == 'recvfrom')
    connection = reads.most_common(1)[0][0]
    if len(sys.argv) == 4:
        wal, db = int(sys.argv[2]), int(sys.argv[3])
    else:
        headers = collections.Counter(c[4] for c in calls
                                      if c[3] == 'pwrite64' and 'count: 24,' in c[5])
        wal = headers.most_common(1)[0][0]
        others = collections.Counter(c[4] for c in calls if c[3] == 'pwrite64' and c[4] != wal)
        db = others.most_common(1)[0][0] if others else -1
    print('connection fd %d, log fd %d, database fd %d' % (connection, wal, db))

    requests, began = [], None
    for start, duration, _, name, fd, _, result in calls:
        if fd != connection:
            continue
        if name == 'recvfrom' and not result.startswith('-') and result != '0':
            began = start + duration
        elif name == 'sendto' and began is not None:
            requests.append((began, start + duration))
            began = None
    latencies = sorted(end - begin for begin, end in requests)
    print('%d requests: p50 %.3f ms, p90 %.3f ms, p99 %.3f ms' %
          (len(latencies), percentile(latencies, 0.5), percentile(latencies, 0.9),
           percentile(latencies, 0.99)))

    def inside(begin, end):
        return [c for c in calls if begin <= c[0] < end]

    def label(call):
        if call[3] in ('fdatasync', 'fsync', 'pwrite64'):
            which = {wal: 'log', db: 'database'}.get(call[4], 'other')
            return '%s (%s)' % (call[3], which)
        return call[3]

    def profile(title, chosen):
        count, time = collections.Counter(), collections.Counter()
        for begin, end in chosen:
            for call in inside(begin, end):
                count[label(call)] += 1
                time[label(call)] += call[1]
        print(title)
        for name, n in count.most_common():
            print('  %-22s %6.2f a request, %.3f ms a request' %
                  (name, n / len(chosen), time[name] / len(chosen)))

    slow_mark = percentile(latencies, 0.98)
    slow = [r for r in requests if r[1] - r[0] >= slow_mark]
    fast = [r for r in requests if r[1] - r[0] < percentile(latencies, 0.5)]
    profile('slowest 2%% (>= %.3f ms), %d requests:' % (slow_mark, len(slow)), slow)
    profile('faster half, %d requests:' % len(fast), fast)

    kinds = collections.Counter()
    for begin, end in slow:
        within = inside(begin, end)
        syncs = [c for c in within if c[3] in ('fdatasync', 'fsync')]
        kind = []
        if any(c[3] == 'pwrite64' and c[4] == db for c in within):
            kind.append('checkpoint')
        if any(c[1] > 1.0 for c in syncs):
            kind.append('a sync over 1 ms')
        kind.append('%d syncs' % len(syncs))
        if any(c[3] in ('openat', 'rename', 'renameat2', 'unlink') for c in within):
            kind.append('files made or renamed')
        kinds[', '.join(kind)] += 1
    print('what the slowest 2% met:')
    for kind, n in kinds.most_common():
        print('  %4d  %s' % (n, kind))

    frames, first = collections.defaultdict(int), {}
    sync_time, commit_time = collections.defaultdict(list), collections.defaultdict(list)
    for start, duration, tid, name, fd, args, _ in calls:
        if fd != wal:
            continue
        if name == 'pwrite64':
            first.setdefault(tid, start)
            if 'count: 24,' not in args:
                frames[tid] += 1
        elif name == 'fdatasync' and frames[tid] > 0:
            n = min(frames[tid], 10)
            sync_time[n].append(duration)
            commit_time[n].append(start + duration - first[tid])
            frames[tid] = 0
            first.pop(tid, None)
    commits = sum(len(v) for v in sync_time.values())
    print('log frames a commit (10: 10 or more), %d commits:' % commits)
    for n in sorted(sync_time):
        syncs, spans = sorted(sync_time[n]), sorted(commit_time[n])
        print('  %2d frames: %5.1f%% of commits, sync p50 %.3f ms, writes and sync p50 %.3f ms' %
              (n, 100.0 * len(syncs) / commits, percentile(syncs, 0.5), percentile(spans, 0.5)))


if __name__ == '__main__':
    main()
