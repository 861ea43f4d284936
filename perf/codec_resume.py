#!/usr/bin/env python3
"""How much a lossy checkpoint moves training: examples/python/train_dlrm.py resumed from a
checkpoint whose tables were stored with each codec pair, its loss beside the exact resume's.

For each pair VALUES/STATE: the example trains --resume-at steps with its tables' codecs set to
the pair and one checkpoint at the end (a full one: the first of its directory), then runs
again on the same directory up to --steps, resuming from it. Every step's batch is a function
of (seed, step) alone, and the dense model and its optimizer are restored bit for bit (they
are attachments, never encoded), so the runs differ only by the tables' rows and Adagrad state
as the codec gave them back. none/none is the exact resume (bit-identical to an uninterrupted
run: tests/python/test_dlrm_resume.py).

Reported per pair, over the steps after the resume: the largest and the mean |loss - exact
loss|, the mean loss of the last 50 steps against the exact run's, and the plot at --plot: the
loss of each run (a moving average of 10 steps) and, below, each step's loss minus the exact
run's.

    build-python/venv/bin/python perf/codec_resume.py --plot docs/codec-resume.png
"""

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "examples", "python", "train_dlrm.py")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--codecs", default="none/none,lossless/lossless,bf16/bf16,int8/bf16",
                   help="pairs VALUES/STATE; the first is the reference (none/none)")
    p.add_argument("--resume-at", type=int, default=200)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--plot", help="write the plot (PNG) here; needs matplotlib")
    p.add_argument("--example-args", default="",
                   help="more arguments for train_dlrm.py (e.g. '--ids 20000')")
    return p.parse_args()


def run(dir, steps, every, values, state, log, threads, extra):
    cmd = [sys.executable, SCRIPT, "--dir", dir, "--steps", str(steps), "--checkpoint-every",
           str(every), "--value-codec", values, "--state-codec", state, "--loss-log", log,
           "--threads", str(threads), "--quiet", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            step, loss = line.split()
            out[int(step)] = float(loss)
    return out


def moving_average(values, n=10):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= n:
            total -= values[i - n]
        out.append(total / min(i + 1, n))
    return out


def main():
    args = parse_args()
    pairs = [c if "/" in c else c + "/none" for c in args.codecs.split(",")]
    extra = args.example_args.split()
    curves = {}
    with tempfile.TemporaryDirectory(prefix="embstore-codec-resume-") as tmp:
        for pair in pairs:
            values, state = pair.split("/")
            d = os.path.join(tmp, pair.replace("/", "-"))
            log = d + ".loss"
            run(d, args.resume_at, args.resume_at, values, state, log, args.threads, extra)
            out = run(d, args.steps, args.steps, values, state, log, args.threads, extra)
            if f"resumed from version {args.resume_at} " not in out:
                raise SystemExit(f"{pair}: the second run did not resume at {args.resume_at}:\n"
                                 f"{out}")
            curves[pair] = losses(log)
            print(f"{pair}: ran", flush=True)
    ref = curves[pairs[0]]
    after = range(args.resume_at + 1, args.steps + 1)
    last = range(args.steps - 49, args.steps + 1)
    ref_last = sum(ref[s] for s in last) / len(last)
    print(f"\nresumed at step {args.resume_at}, trained to {args.steps}; reference {pairs[0]}, "
          f"mean loss of the last 50 steps {ref_last:.6f}\n")
    print("| codecs | max abs loss difference | mean abs loss difference | mean loss, last 50 "
          "steps | against the reference |")
    print("|---|---|---|---|---|")
    for pair in pairs:
        c = curves[pair]
        diffs = [abs(c[s] - ref[s]) for s in after]
        mean_last = sum(c[s] for s in last) / len(last)
        print(f"| {pair} | {max(diffs):.3g} | {sum(diffs) / len(diffs):.3g} | {mean_last:.6f} | "
              f"{(mean_last - ref_last) / ref_last * 100:+.3f}% |")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax, diff) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True,
                                       gridspec_kw={"height_ratios": [3, 2]})
        first = max(1, args.resume_at - 100)
        for pair in pairs:
            steps = [s for s in sorted(curves[pair]) if s >= first]
            style = "-" if pair == pairs[0] else "--"
            ax.plot(steps, moving_average([curves[pair][s] for s in steps]), label=pair,
                    linewidth=1.2, linestyle=style)
            diff.plot(list(after), [curves[pair][s] - ref[s] for s in after], label=pair,
                      linewidth=1.0, linestyle=style)
        for a in (ax, diff):
            a.axvline(args.resume_at, color="grey", linewidth=0.8)
        ax.text(args.resume_at, ax.get_ylim()[1], " resumed", va="top", color="grey")
        ax.set_ylabel("loss (moving average of 10 steps)")
        ax.set_title("train_dlrm.py resumed from checkpoints stored with each codec")
        ax.legend(title="values/state")
        diff.set_xlabel("step")
        diff.set_ylabel(f"loss - {pairs[0]}'s loss")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
