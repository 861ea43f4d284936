"""embstore-ckpt, the checkpoint directory tool, as shipped inside the package: `embstore-ckpt`
on the PATH of the environment (a console script), or embstore.ckpt.run([...]) from Python."""

import os
import subprocess
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def binary():
    """The path of the bundled embstore-ckpt (EMBSTORE_CKPT overrides it)."""
    return os.environ.get("EMBSTORE_CKPT") or os.path.join(_HERE, "bin", "embstore-ckpt")


def run(args, **kwargs):
    """Runs embstore-ckpt with args (ls, verify, inspect, compact, reshard, export ...) and
    returns the subprocess.CompletedProcess; check=True raises on a nonzero exit."""
    return subprocess.run([binary(), *map(os.fspath, args)], **kwargs)


def verify(dir, version=None, serving=False):
    """True exactly when embstore.Store.restore would load that version (the newest: None); with
    serving=True, a serving-only directory's version (a policy's serving_dir) is True when a
    Follower can read it."""
    # Without --version the tool checks every version in dir; restore loads the newest only.
    args = ["verify", dir, "--version", "latest" if version is None else str(version)]
    if serving:
        args.append("--serving")
    return run(args, capture_output=True).returncode == 0


def main():
    """The `embstore-ckpt` console script: replaces this process with the bundled binary, with
    this process's arguments."""
    os.execv(binary(), [binary(), *sys.argv[1:]])
