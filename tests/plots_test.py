#!/usr/bin/env python3
"""scripts/plots.py against a fixture set of the benchmarks' JSON
(tests/data/plots): every chart is written as a PNG of its fixed pixel size,
the same JSON gives the same bytes, and a file that is not valid JSON or
lacks a field fails with a message naming the file, not a traceback.

  python3 tests/plots_test.py      (ctest runs it as plots_test)
"""

import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLOTS = os.path.join(ROOT, "scripts", "plots.py")
FIXTURES = os.path.join(ROOT, "tests", "data", "plots")

# What each chart must be: width and height in pixels.
EXPECTED = {
    "peers-throughput.png": (1000, 560),
    "peers-latency.png": (1100, 560),
    "engine-memory.png": (1000, 480),
    "scenario-caps.png": (1000, 520),
}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    """(width, height) from the PNG's IHDR chunk, which must come first."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != PNG_SIGNATURE or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def render(data, out):
    return subprocess.run([sys.executable, PLOTS, "--data", data, "--out", out],
                          capture_output=True, text=True, timeout=240)


class PlotsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tidemark-plots-test-")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def fixture_copy(self):
        data = os.path.join(self.tmp, "data")
        shutil.copytree(FIXTURES, data)
        return data

    def test_every_chart_is_a_png_of_its_size(self):
        out = os.path.join(self.tmp, "plots")
        run = render(FIXTURES, out)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(sorted(os.listdir(out)), sorted(EXPECTED))
        for name, size in EXPECTED.items():
            path = os.path.join(out, name)
            with open(path, "rb") as f:
                self.assertEqual(f.read(8), PNG_SIGNATURE, name)
            self.assertEqual(png_size(path), size, name)
            self.assertIn(name, run.stdout)

    def test_the_same_json_gives_the_same_bytes(self):
        first, second = os.path.join(self.tmp, "a"), os.path.join(self.tmp, "b")
        for out in (first, second):
            run = render(FIXTURES, out)
            self.assertEqual(run.returncode, 0, run.stderr)
        for name in EXPECTED:
            with open(os.path.join(first, name), "rb") as a, \
                    open(os.path.join(second, name), "rb") as b:
                self.assertEqual(a.read(), b.read(), name + " differs between two renderings")

    def test_malformed_json_names_the_file(self):
        data = self.fixture_copy()
        broken = os.path.join(data, "peers.json")
        with open(broken, "w") as f:
            f.write('{"command": "bench/peers/run.sh", "rows": [\n')
        run = render(data, os.path.join(self.tmp, "plots"))
        self.assertNotEqual(run.returncode, 0)
        self.assertIn(broken + ": not valid JSON", run.stderr)
        self.assertNotIn("Traceback", run.stderr)
        # The other inputs' charts are still drawn.
        self.assertTrue(os.path.exists(os.path.join(self.tmp, "plots", "engine-memory.png")))

    def test_a_missing_field_names_the_file_and_field(self):
        data = self.fixture_copy()
        path = os.path.join(data, "engine-memory.json")
        with open(path, "w") as f:
            f.write('{"command": "bench/engine_sizes.sh", "commit": null,'
                    ' "date": "2026-12-05T00:00:00Z", "runs": [{"updates": 1000000}]}')
        run = render(data, os.path.join(self.tmp, "plots"))
        self.assertNotEqual(run.returncode, 0)
        self.assertIn(path + ": runs[0]: no \"result\"", run.stderr)
        self.assertNotIn("Traceback", run.stderr)

    def test_a_wrong_type_names_the_file_and_field(self):
        data = self.fixture_copy()
        path = os.path.join(data, "scenario-caps.json")
        with open(path, "w") as f:
            f.write('{"command": "scenarios/run", "date": "2026-12-05T00:00:00Z", "runs":'
                    ' [{"scenario": "x", "result": "pass", "peak_rss_mib": "20",'
                    ' "cap_mib": 128, "seconds": 1}]}')
        run = render(data, os.path.join(self.tmp, "plots"))
        self.assertNotEqual(run.returncode, 0)
        self.assertIn(path + ": runs[0]: \"peak_rss_mib\" is not a number", run.stderr)
        self.assertNotIn("Traceback", run.stderr)

    def test_no_input_at_all_is_an_error(self):
        empty = os.path.join(self.tmp, "empty")
        os.mkdir(empty)
        run = render(empty, os.path.join(self.tmp, "plots"))
        self.assertNotEqual(run.returncode, 0)
        self.assertIn(empty + ": none of peers.json", run.stderr)
        self.assertNotIn("Traceback", run.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
