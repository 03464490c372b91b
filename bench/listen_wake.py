#!/usr/bin/env python3
"""Write-to-listen latency and the cost of idle listen streams, over HTTP.

Starts `tidemark serve` on a scratch data directory and, on one shard:
  - latency: one listen stream open; N managed appends of one record, one
    at a time; each timed from the append's send to its update line's
    arrival on the stream (p50/p90/p99, ms);
  - idle: S more listen streams open and idle; the server's CPU (user +
    system, /proc) over a window with nothing appended, in % of one core,
    and its RSS before and after opening them; then one append, and the
    time until every stream has seen it.

With --two-servers, two `tidemark serve` processes share one PostgreSQL
consensus and one S3 blob store (--consensus and --blob, by default
TIDEMARK_TEST_POSTGRES and TIDEMARK_TEST_S3 as scripts/test-services.sh
sets them, under a blob prefix of the run's own): the appends go through
server A and the listen stream is on server B, so each update crosses
processes (latency only; the idle part is skipped).

usage: bench/listen_wake.py BINARY [--appends N] [--idle S] [--window SECONDS]
                            [--two-servers [--consensus URL] [--blob URL]]
"""
import argparse, os, selectors, signal, socket, subprocess, sys, tempfile, time, json, resource


def http(port, method, path, body=b""):
    s = socket.create_connection(("127.0.0.1", port))
    req = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    s.sendall(req.encode() + body)
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest


def open_listen(port, shard):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"GET /v1/shards/{shard}/listen?from=0 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    s.setblocking(False)
    return s


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads"):
                return int(line.split()[1])
    return 0


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--appends", type=int, default=200)
    ap.add_argument("--idle", type=int, default=2000)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--two-servers", action="store_true")
    ap.add_argument("--consensus", default=os.environ.get("TIDEMARK_TEST_POSTGRES"))
    ap.add_argument("--blob", default=os.environ.get("TIDEMARK_TEST_S3"))
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    d = tempfile.mkdtemp()
    port = 20000 + os.getpid() % 10000
    servers = []
    if a.two_servers:
        if not a.consensus or not a.blob:
            sys.exit("--two-servers needs --consensus and --blob (or scripts/test-services.sh)")
        run = f"listen-wake-{os.getpid()}-{int(time.time())}"
        base, q, query = a.blob.partition("?")
        blob = f"{base}/{run}{q}{query}"
        for i, name in enumerate("ab"):
            servers.append(subprocess.Popen(
                [a.binary, "--data", f"{d}/data-{name}", "--blob", blob, "--consensus", a.consensus,
                 "serve", "--listen", f"127.0.0.1:{port + i}"],
                stdout=subprocess.DEVNULL, stderr=open(f"{d}/serve-{name}.log", "w")))
        write_port, listen_port = port, port + 1
        shard = "w" + run.replace("-", "")
    else:
        servers.append(subprocess.Popen(
            [a.binary, "--data", d + "/data", "serve", "--listen", f"127.0.0.1:{port}",
             "--max-connections", str(a.idle + 100)],
            stdout=subprocess.DEVNULL, stderr=open(d + "/serve.log", "w")))
        write_port = listen_port = port
        shard = "w"
    server = servers[0]
    try:
        for p in {write_port, listen_port}:
            for _ in range(200):
                try:
                    http(p, "GET", "/v1/shards")
                    break
                except OSError:
                    time.sleep(0.05)
        http(write_port, "POST", "/v1/shards", f'{{"name":"{shard}"}}'.encode())
        # Latency.
        stream = open_listen(listen_port, shard)
        if a.two_servers:
            time.sleep(1)  # the stream is open and idle
        sel = selectors.DefaultSelector()
        sel.register(stream, selectors.EVENT_READ)
        buf = b""
        lat = []
        for i in range(a.appends):
            key = f"k{i}"
            t0 = time.perf_counter()
            code, body = http(write_port, "POST", f"/v1/shards/{shard}/append",
                              f'{{"key":"{key}","value":"v"}}\n'.encode())
            assert code == 200, body
            needle = f'"key":"{key}"'.encode()
            while needle not in buf:
                for _ in sel.select(5):
                    buf += stream.recv(65536)
            lat.append((time.perf_counter() - t0) * 1000)
            buf = buf[buf.index(needle):]
        lat.sort()
        pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
        print(json.dumps({"write_to_listen_ms": {"p50": round(pct(0.5), 2), "p90": round(pct(0.9), 2),
                                                 "p99": round(pct(0.99), 2), "n": len(lat)}}))
        if a.two_servers:
            return
        # Idle streams.
        rss0 = rss_mib(server.pid)
        idle = []
        for i in range(a.idle):
            idle.append(open_listen(port, "w"))
            if i % 200 == 199:
                time.sleep(0.05)
        time.sleep(3)  # every stream has read the history and gone idle
        for s in idle:  # drain what they were sent
            try:
                while s.recv(65536):
                    pass
            except BlockingIOError:
                pass
        rss1 = rss_mib(server.pid)
        c0 = cpu_seconds(server.pid)
        time.sleep(a.window)
        c1 = cpu_seconds(server.pid)
        t0 = time.perf_counter()
        code, _ = http(port, "POST", "/v1/shards/w/append", b'{"key":"last","value":"v"}\n')
        assert code == 200
        pending = set(range(len(idle)))
        bufs = [b""] * len(idle)
        sel2 = selectors.DefaultSelector()
        for i, s in enumerate(idle):
            sel2.register(s, selectors.EVENT_READ, i)
        while pending and time.perf_counter() - t0 < 60:
            for key, _ in sel2.select(1):
                i = key.data
                try:
                    bufs[i] += key.fileobj.recv(65536)
                except BlockingIOError:
                    continue
                if b'"key":"last"' in bufs[i]:
                    pending.discard(i)
                    sel2.unregister(key.fileobj)
        woke = time.perf_counter() - t0
        print(json.dumps({"idle_streams": a.idle, "cpu_percent_of_a_core": round(100 * (c1 - c0) / a.window, 2),
                          "rss_mib_before": round(rss0, 1), "rss_mib_with_streams": round(rss1, 1),
                          "kib_per_stream": round((rss1 - rss0) * 1024 / max(1, a.idle), 1),
                          "all_woken_s": round(woke, 3), "server_threads": threads(server.pid), "not_woken": len(pending)}))
    finally:
        for server in servers:
            server.send_signal(signal.SIGTERM)
        for server in servers:
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
        subprocess.run(["rm", "-rf", d])


main()
