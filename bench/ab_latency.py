#!/usr/bin/env python3
"""Two builds of `tidemark serve`, side by side under one client, to tell a
small change in one-client latency from this VM's drift: starts A and B,
each on the embedded default in a scratch directory of its own, makes the
shard `ab` on both, then sends PAIRS pairs of one-record managed appends,
one request at a time, each pair to A and B in a random order. Both see the
same moments of the disk's and the host's weather, so the difference of
their means is measured far more finely than by runs one after the other.

    python3 bench/ab_latency.py A B [PAIRS] [WARMUP]

A and B are commands (an executable, or a shell line run by sh -c) that
take tidemark's arguments; PAIRS defaults to 20,000, WARMUP (pairs not
counted) to 1,000. Prints each side's p50, p90, p99 and mean (ms), and the
mean of B - A over the pairs with its 95% interval (what a difference must
exceed to be a difference). Ports: $PORT and $PORT + 1 (27101)."""
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
    scratch = tempfile.mkdtemp(prefix='tidemark-ab.')
    servers = []
    try:
        for i, command in enumerate(commands):
            servers.append(start(command, os.path.join(scratch, 'ab'[i]), port + i))
        latencies = ([], [])
        order = random.Random(1)
        for n in range(warmup + pairs):
            sides = [0, 1]
            order.shuffle(sides)
            took = [0.0, 0.0]
            for side in sides:
                took[side] = append(servers[side][1], n)
            if n >= warmup:
                latencies[0].append(took[0])
                latencies[1].append(took[1])
    finally:
        for process, _ in servers:
            process.terminate()
            process.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    for i, name in enumerate('AB'):
        values = latencies[i]
        print('%s: p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  mean %.3f ms  (%s)' %
              (name, percentile(values, 0.5), percentile(values, 0.9), percentile(values, 0.99),
               sum(values) / len(values), commands[i]))
    differences = [b - a for a, b in zip(*latencies)]
    mean = sum(differences) / len(differences)
    spread = math.sqrt(sum((d - mean) ** 2 for d in differences) / (len(differences) - 1))
    half = 1.96 * spread / math.sqrt(len(differences))
    print('B - A: mean %+.4f ms, 95%% interval %+.4f to %+.4f ms, over %d pairs' %
          (mean, mean - half, mean + half, len(differences)))
    medians = sorted(latencies[1])[len(differences) // 2] - sorted(latencies[0])[len(differences) // 2]
    print('B - A: p50 %+.4f ms' % medians)


if __name__ == '__main__':
    main()
