"""Shared by the Python tests: a temporary directory per test."""

import shutil
import tempfile
import unittest


class TempDirTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="embstore-py-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def path(self, *parts):
        import os
        return os.path.join(self.dir, *parts)
