"""The README's Python example (examples/python/quickstart.py) run as a user runs it, against the
installed package: it trains, checkpoints, restores into a new store and exits 0 only when the
restored rows equal the trained ones."""

import os
import subprocess
import sys
import unittest

from support import TempDirTest

QUICKSTART = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python",
                          "quickstart.py")


class QuickstartTest(TempDirTest):
    def test_the_readme_example_restores_what_it_trained(self):
        ckpt = os.path.join(self.dir, "ckpt")
        r = subprocess.run([sys.executable, QUICKSTART, ckpt], capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        lines = r.stdout.splitlines()
        # One line per checkpoint (a full one, then two deltas), then the restore's.
        self.assertEqual([line.split()[0] for line in lines[:3]],
                         ["full", "incremental", "incremental"], r.stdout)
        self.assertEqual(lines[3], "3 b'offset=3'")
        self.assertEqual(lines[-1], "restored version 3: rows equal the trained ones")
        self.assertTrue(any(name.endswith(".full") for name in os.listdir(ckpt)))


if __name__ == "__main__":
    unittest.main()
