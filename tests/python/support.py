"""Shared by the Python tests: a temporary directory per test, and the float tolerance of
comparisons with torch (test_torch.py's docstring says why 1e-5)."""

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


def close(test, got, expected):
    """got within 1e-5 of expected's largest magnitude (torch tensors, on any device)."""
    got = got.detach().double().cpu().numpy()
    expected = expected.detach().double().cpu().numpy()
    scale = abs(expected).max()
    test.assertLess(abs(got - expected).max() / scale, 1e-5)
