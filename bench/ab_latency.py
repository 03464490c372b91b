#!/usr/bin/env python3
"""Two builds of `tidemark serve`, side by side under one client, to tell a
small change in one-client latency from this VM's drift: starts A and B,
each on the embedded default in a scratch directory of its own, makes the
shard `ab` on both, then sends one-record managed appends, one request at a
time, in blocks of $BLOCK (16) back to back, a block to A and a block to B
in a random order. Within a block a server sees the load of one client
that sends its next request as soon as it has the answer; across blocks
both see the same moments of the disk's and the host's weather, so the
difference of their means is measured far more finely than by runs one
after the other.

    python3 bench/ab_latency.py A B [PAIRS] [WARMUP]

A and B are commands (an executable, or a shell line run by sh -c) that
take tidemark's arguments; PAIRS (requests to each, rounded to whole
blocks) defaults to 20,000, WARMUP (pairs not counted) to 1,000. Prints
each side's p50, p90, p99 and mean (ms), and the mean of B - A over the
pairs of blocks with its 95% interval (what a difference must exceed to be
a difference). It runs two sessions of PAIRS / 2, the second with A and B
on each other's port and directory. Ports: $PORT and $PORT + 1 (27101)."""
import http.client
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def start(command, data, port):
    argv = ['--data', data, 'serve', '--listen', '127.0.0.1:%d' % port]
    if os.access(command, os.X_OK) and not os.path.isdir(command):
        process = subprocess.Popen([command] + argv, stderr=subprocess.DEVNULL)
    else:
        process = subprocess.Popen(['sh', '-c', command + ' "$@"', 'sh'] + argv,
                                   stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            connection = http.client.HTTPConnection('127.0.0.1', port)
            connection.request('GET', '/healthz')
            connection.getresponse().read()
            break
        except OSError:
            time.sleep(0.05)
    else:
        sys.exit('ab_latency.py: %s did not start on port %d' % (command, port))
    connection.request('POST', '/v1/shards', body='{"name": "ab"}')
    answer = connection.getresponse()
    answer.read()
    if answer.status != 201:
        sys.exit('ab_latency.py: creating the shard on %s: HTTP %d' % (command, answer.status))
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return process, connection


def append(connection, n):
    """One managed append on the connection's socket, as raw bytes (the
    Python HTTP client's own cost would bury the difference)."""
    body = b'{"key":"k%d","value":"%s"}\n' % (n, b'x' * 90)
    request = (b'POST /v1/shards/ab/append HTTP/1.1\r\nHost: ab\r\n'
               b'Content-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n' %
               len(body)) + body
    sock = connection.sock
    began = time.perf_counter()
    sock.sendall(request)
    answer = b''
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            sys.exit('ab_latency.py: the server closed the connection')
        answer += chunk
        head_end = answer.find(b'\r\n\r\n')
        if head_end < 0:
            continue
        head = answer[:head_end].lower()
        length = int(head.split(b'content-length:')[1].split(b'\r\n')[0])
        if len(answer) >= head_end + 4 + length:
            break
    elapsed = time.perf_counter() - began
    if not answer.startswith(b'HTTP/1.1 200'):
        sys.exit('ab_latency.py: append answered %r' % answer[:200])
    return elapsed * 1000.0


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    commands = sys.argv[1:3]
    pairs = int(sys.argv[3]) if len(sys.argv) > 3 else 20000
    warmup = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
    port = int(os.environ.get('PORT', '27101'))
    block = int(os.environ.get('BLOCK', '16'))
    latencies = ([], [])
    differences = []  # per pair of blocks: B's mean - A's mean
    # Two sessions, the second with A and B on each other's port and
    # directory, so that whatever favours one place cancels out (A against
    # itself differed by 14 us in one session).
    for swapped in (False, True):
        slots = [1, 0] if swapped else [0, 1]  # slots[command] = the place it runs in
        scratch = tempfile.mkdtemp(prefix='tidemark-ab.')
        servers = [None, None]
        try:
            for command in (0, 1):
                place = slots[command]
                servers[command] = start(commands[command], os.path.join(scratch, 'ab'[place]),
                                         port + place)
            order = random.Random(1 + swapped)
            n = 0
            half = pairs // 2
            for round_number in range((warmup + half + block - 1) // block):
                sides = [0, 1]
                order.shuffle(sides)
                took = ([], [])
                for side in sides:
                    for _ in range(block):
                        took[side].append(append(servers[side][1], n))
                        n += 1
                if round_number * block >= warmup:
                    latencies[0].extend(took[0])
                    latencies[1].extend(took[1])
                    differences.append(sum(took[1]) / block - sum(took[0]) / block)
        finally:
            for server in servers:
                if server is not None:
                    server[0].terminate()
                    server[0].wait()
            shutil.rmtree(scratch, ignore_errors=True)
    for i, name in enumerate('AB'):
        values = latencies[i]
        print('%s: p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  mean %.3f ms  (%s)' %
              (name, percentile(values, 0.5), percentile(values, 0.9), percentile(values, 0.99),
               sum(values) / len(values), commands[i]))
    mean = sum(differences) / len(differences)
    spread = math.sqrt(sum((d - mean) ** 2 for d in differences) / (len(differences) - 1))
    half = 1.96 * spread / math.sqrt(len(differences))
    print('B - A: mean %+.4f ms, 95%% interval %+.4f to %+.4f ms, over %d pairs of blocks of %d' %
          (mean, mean - half, mean + half, len(differences), len(latencies[0]) // len(differences)))
    middle = len(latencies[0]) // 2
    medians = sorted(latencies[1])[middle] - sorted(latencies[0])[middle]
    print('B - A: p50 %+.4f ms' % medians)


if __name__ == '__main__':
    main()
