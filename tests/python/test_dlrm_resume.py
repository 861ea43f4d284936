"""examples/python/train_dlrm.py: killed by SIGKILL and run again, it resumes from its last
checkpoint and ends bit-identical to an uninterrupted run (the CPU, the same thread count), on
one process and on two under torchrun (sharded stores over gloo)."""

import os
import re
import signal
import subprocess
import sys
import unittest

from support import TempDirTest

try:
    import torch  # noqa: F401
    import torch.distributed as dist
    gloo = dist.is_available() and dist.is_gloo_available()
except ImportError:  # pragma: no cover
    torch = None
    gloo = False

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python",
                      "train_dlrm.py")
ARGS = ["--steps", "60", "--checkpoint-every", "20", "--ids", "20000", "--batch", "256",
        "--threads", "2", "--quiet"]


def run(dir, *extra, processes=1):
    """The example on one process, or under torchrun on several (a gloo group on this
    machine)."""
    launch = [sys.executable]
    if processes > 1:
        launch += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                   str(processes)]
    # gloo on the loopback device: no dependence on how the machine's hostname resolves.
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo") if processes > 1 else None
    return subprocess.run([*launch, SCRIPT, "--dir", dir, *ARGS, *extra],
                          capture_output=True, text=True, timeout=600, env=env)


def digest_of(result):
    m = re.search(r"^digest ([0-9a-f]{64})$", result.stdout, re.M)
    return m and m.group(1)


@unittest.skipIf(torch is None, "torch is not installed")
class ResumeTest(TempDirTest):
    def test_kill_and_resume_is_bit_identical(self):
        whole = run(self.path("whole"))
        self.assertEqual(whole.returncode, 0, whole.stderr)
        self.assertIsNotNone(digest_of(whole), whole.stdout)

        killed = run(self.path("resumed"), "--kill-at-step", "47")
        self.assertEqual(killed.returncode, -signal.SIGKILL, killed.stderr)
        self.assertIsNone(digest_of(killed))
        resumed = run(self.path("resumed"))
        self.assertEqual(resumed.returncode, 0, resumed.stderr)
        # The newest checkpoint committed before the kill: 40, or 20 where 40 was still being
        # written (a slow disk, a loaded machine).
        m = re.search(r"^resumed from version (\d+) \(step \1\)$", resumed.stdout, re.M)
        self.assertIsNotNone(m, resumed.stdout)
        self.assertIn(int(m.group(1)), (20, 40))
        self.assertEqual(digest_of(resumed), digest_of(whole))

    @unittest.skipUnless(gloo, "needs torch.distributed with gloo")
    def test_two_processes_kill_and_resume_bit_identical_and_resume_on_one(self):
        whole = run(self.path("whole"), processes=2)
        self.assertEqual(whole.returncode, 0, whole.stderr)
        self.assertIsNotNone(digest_of(whole), whole.stdout)

        # The last rank kills itself after step 47; torchrun then ends the other.
        killed = run(self.path("resumed"), "--kill-at-step", "47", processes=2)
        self.assertNotEqual(killed.returncode, 0, killed.stderr)
        self.assertIsNone(digest_of(killed))
        resumed = run(self.path("resumed"), processes=2)
        self.assertEqual(resumed.returncode, 0, resumed.stderr)
        m = re.search(r"^resumed from version (\d+) \(step \1\)$", resumed.stdout, re.M)
        self.assertIsNotNone(m, resumed.stdout)
        self.assertIn(int(m.group(1)), (20, 40))
        self.assertEqual(digest_of(resumed), digest_of(whole))

        # One process resumes the two's finished run: the rows of both shards and rank 0's
        # trainer state, to the same digest (no step is left to train).
        one = run(self.path("whole"))
        self.assertEqual(one.returncode, 0, one.stderr)
        self.assertIn("resumed from version 60 (step 60)", one.stdout)
        self.assertEqual(digest_of(one), digest_of(whole))
        # Not what one process computes from scratch (the dense gradients are summed in another
        # order), so the equality above came from the two processes' checkpoint.
        alone = run(self.path("alone"))
        self.assertNotEqual(digest_of(alone), digest_of(whole))

    @unittest.skipUnless(gloo, "needs torch.distributed with gloo")
    def test_one_process_run_goes_on_on_two(self):
        # Rank 1 has no trainer state in a checkpoint of one process: it gets rank 0's, and the
        # example checks at the end that the two dense replicas stayed identical.
        first = run(self.path("grow"), "--steps", "20")
        self.assertEqual(first.returncode, 0, first.stderr)
        grown = run(self.path("grow"), "--steps", "30", processes=2)
        self.assertEqual(grown.returncode, 0, grown.stdout + grown.stderr)
        self.assertIn("resumed from version 20 (step 20)", grown.stdout)
        self.assertIsNotNone(digest_of(grown), grown.stdout)

    def test_resume_from_codecs_lossless_exact_and_lossy_close(self):
        # Stopped at step 20 and resumed to 40: with lossless tables the digest is an
        # uninterrupted run's; with int8 values and bf16 state the run resumes from rounded rows
        # (another digest) and its loss stays within a small distance of the exact run's.
        def stop_and_resume(name, *codecs):
            first = run(self.path(name), "--steps", "20", *codecs, "--loss-log",
                        self.path(name + ".loss"))
            self.assertEqual(first.returncode, 0, first.stderr)
            second = run(self.path(name), "--steps", "40", *codecs, "--loss-log",
                         self.path(name + ".loss"))
            self.assertEqual(second.returncode, 0, second.stderr)
            self.assertIn("resumed from version 20 (step 20)", second.stdout)
            with open(self.path(name + ".loss")) as f:
                losses = dict(line.split() for line in f)
            return digest_of(second), {int(k): float(v) for k, v in losses.items()}

        whole = run(self.path("whole"), "--steps", "40")
        self.assertEqual(whole.returncode, 0, whole.stderr)
        lossless, exact = stop_and_resume("lossless", "--value-codec", "lossless",
                                          "--state-codec", "lossless")
        self.assertEqual(lossless, digest_of(whole))
        lossy, close = stop_and_resume("lossy", "--value-codec", "int8", "--state-codec", "bf16")
        self.assertNotEqual(lossy, digest_of(whole))
        self.assertEqual(sorted(close), list(range(1, 41)))
        for step in range(1, 21):  # before the resume: the same training
            self.assertEqual(close[step], exact[step])
        worst = max(abs(close[s] - exact[s]) for s in range(21, 41))
        self.assertGreater(worst, 0)
        self.assertLess(worst, 0.01)

    def test_a_different_run_differs(self):
        # The digest can tell runs apart: another seed gives another digest.
        a = run(self.path("a"), "--steps", "5")
        b = run(self.path("b"), "--steps", "5", "--seed", "2")
        self.assertEqual((a.returncode, b.returncode), (0, 0), a.stderr + b.stderr)
        self.assertNotEqual(digest_of(a), digest_of(b))


if __name__ == "__main__":
    unittest.main()
