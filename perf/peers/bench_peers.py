#!/usr/bin/env python3
"""embstore against its peers: the same state (keys int64 (R,), values float32 (R, 64), Adagrad
accumulators float32 (R, 64)) saved until durable by numpy, safetensors, torch.save, torch DCP,
DCP async_save, Orbax and embstore; a 1% delta; the training thread's stall; the restore from
a cold page cache; peak memory; and a DLRM-like training step with embstore's tables against
nn.EmbeddingBag(sparse=True) + torch.optim.Adagrad. Run by scripts/bench-peers.sh.

    bench_peers.py --rows R --dir DATA_DIR --out OUT_DIR [--repeat N] [--quick]
                   [--savers a,b,...] [--train-steps N] [--train-rows N] [--no-train]

Each measurement runs in a fresh child process (this file with --child ...), so that peak
memory is the saver's own and no saver's page cache or allocator state helps another:
  save child:    builds the state, resets its peak RSS, saves it in full (timed until durable),
                 changes 1% of the rows, saves again (peers: everything, into a new directory;
                 embstore: an incremental checkpoint);
  driver:        fsync + posix_fadvise(DONTNEED) on every file of the full checkpoint, checks
                 with mincore(2) how much of it is still cached;
  restore child: loads the full checkpoint back into memory (timed) and checks sampled rows.
Each restore runs twice, because on a VM whose balloon reports free pages to the host (this
project's machines) where the memory comes from decides the figure as much as the disk does:
  settled: the driver first waits --settle seconds, so that the memory the previous child freed
           is handed back to the host, and every page the load touches costs a host fault (a
           trainer restarted on an idle VM);
  backed:  the child first touches and frees twice the state's bytes (back_memory), so that the
           load finds memory the host already backs (as on a machine that is not a VM). The
           guest starts reporting freed memory 2 s after it was freed, so some of it may be
           handed back during the load; each load's system time (in the JSON) shows what it
           paid (on this project's machine about 1 s backed against 15-16 s settled, 10M rows).
"""

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import resource
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import (PeakMeter, back_memory, bytes_under, disk_baseline,  # noqa: E402
                    drop_cache, free_page_reporting, meminfo, resident_bytes)

GOALS = {
    "full": 1.5,      # embstore's full checkpoint vs the fastest peer's save
    "delta": 30.0,    # embstore's 1% delta vs the fastest peer's re-save
    "restore": 1.0,   # embstore's restore vs the fastest peer's cold load
    "train": 1.0,     # embstore tables' steps/s vs nn.EmbeddingBag(sparse) + Adagrad
}
SAMPLE = 64
STATE_ROW_BYTES = 8 + 2 * 64 * 4  # an int64 key, 64 float32 values, 64 float32 accumulators


# ================================================================================ children ==

def child_save(a):
    import numpy as np
    from savers import SAVERS
    saver = SAVERS[a.saver]()
    out = {"saver": a.saver, "rows": a.rows}
    saver.import_libs()
    t0 = time.perf_counter()
    saver.build(a.rows, a.seed)
    out["build_seconds"] = time.perf_counter() - t0
    rng = np.random.default_rng(a.seed + 1)
    delta_idx = rng.choice(a.rows, size=max(1, a.rows // 100), replace=False)
    # Sampled rows for the restore's check: some the delta changes, some at random.
    idx = np.unique(np.concatenate([delta_idx[:SAMPLE // 2],
                                    rng.integers(0, a.rows, SAMPLE // 2)]))
    expected = saver.sample(idx)
    meter = PeakMeter()
    os.makedirs(a.workdir, exist_ok=True)
    embstore = a.saver == "embstore"
    full_path = os.path.join(a.workdir, "ckpt" if embstore else "full")

    meter.start()
    out["rss_after_build_bytes"] = meter.base
    if embstore:
        stall, total, extra = saver.save_kind(full_path, "full")
        out["version_full"] = extra["version"]
        out["full_bytes_on_disk"] = bytes_under(full_path)
    else:
        stall, total, extra = saver.save(full_path)
        out["full_bytes_on_disk"] = bytes_under(full_path)
    out.update(full_s=total, full_stall_s=stall, full_extra=extra,
               full_peak_rss_extra_bytes=meter.extra(), peak_method=meter.method)
    out["full_path"] = full_path

    saver.modify(delta_idx, np.float32(1e-3))
    out["delta_rows"] = int(len(delta_idx))
    expected_delta = saver.sample(idx)
    meter.start()
    if embstore:
        before = out["full_bytes_on_disk"]
        stall, total, extra = saver.save_kind(full_path, "incremental")
        out["delta_bytes_on_disk"] = bytes_under(full_path) - before
    else:
        delta_path = os.path.join(a.workdir, "delta")
        stall, total, extra = saver.save(delta_path)
        out["delta_bytes_on_disk"] = bytes_under(delta_path)
        shutil.rmtree(delta_path)  # not needed further: keep the disk footprint down
    out.update(delta_s=total, delta_stall_s=stall, delta_extra=extra,
               delta_peak_rss_extra_bytes=meter.extra())
    if hasattr(saver, "close"):
        saver.close()
    np.savez(os.path.join(a.workdir, "sample.npz"), idx=idx,
             **{"full_" + k: v for k, v in expected.items()},
             **{"delta_" + k: v for k, v in expected_delta.items()})
    return out


def child_restore(a):
    import numpy as np
    from savers import SAVERS
    saver = SAVERS[a.saver]()
    saver.import_libs()
    exp = np.load(os.path.join(a.workdir, "sample.npz"))
    which = "delta" if a.chain else "full"
    meta = {"sample_keys": exp[which + "_keys"]}
    if a.version is not None:
        meta["version"] = a.version
    backing = None
    if a.back_bytes:
        # At most what the machine has free, less 2 GiB for the load's own bookkeeping.
        n = min(a.back_bytes, max(0, (meminfo("MemAvailable") or 0) - (2 << 30)))
        try:
            backing = {"bytes": n, "seconds": back_memory(n)}
        except (OSError, ValueError, MemoryError) as e:  # e.g. strict overcommit
            backing = {"bytes": 0, "error": f"{type(e).__name__}: {e}"}
    meter = PeakMeter()
    meter.start()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    seconds, sample, extra = saver.load(a.path, a.rows, meta)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    # The CPU the load took, all its threads: system time is where page zeroing and the host's
    # faults (a VM's memory handed back, see the module's docstring) show.
    out = {"saver": a.saver, "restore_s": seconds, "extra": extra,
           "peak_rss_extra_bytes": meter.extra(), "backing": backing,
           "cpu": {"user_s": r1.ru_utime - r0.ru_utime, "system_s": r1.ru_stime - r0.ru_stime,
                   "minor_faults": r1.ru_minflt - r0.ru_minflt}}
    got = sample(exp["idx"])
    mismatched = [k for k in got if not np.array_equal(np.asarray(got[k]), exp[which + "_" + k])]
    out["verified"] = not mismatched
    if mismatched:
        out["mismatched"] = mismatched
    return out


def child_train(a):
    import train_step
    return train_step.run(a.variant, a.train_rows, a.batch, a.train_steps, a.warmup, a.seed,
                          a.threads)


# ================================================================================== driver ==

def run_child(args, timeout, log):
    """Runs this file with --child args; -> (result dict, None) or (None, error string)."""
    fd, result = tempfile.mkstemp(prefix="bench-peers-", suffix=".json")
    os.close(fd)
    cmd = [sys.executable, os.path.abspath(__file__), "--child"] + [str(x) for x in args] + \
        ["--result", result]
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONWARNINGS="ignore")
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, env=env)
        text = p.stdout
        if log:
            with open(log, "a") as f:
                f.write(f"$ {shlex.join(cmd)}\n{text}\n[exit {p.returncode}]\n")
        with open(result) as f:
            body = f.read()
        if body:
            r = json.loads(body)
            if "error" in r:
                return None, r["error"]
            if p.returncode == 0:
                return r, None
        return None, f"exit status {p.returncode}: " + text[-3000:].strip()
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode(errors="replace")
        return None, f"timed out after {timeout} s: " + out[-2000:]
    finally:
        os.unlink(result)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fs_of(path):
    """(mount point, file system type, device) holding path, from /proc/mounts."""
    path = os.path.realpath(path)
    best = ("?", "?", "?")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                mnt = mnt.replace("\\040", " ")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and \
                        len(mnt) >= len(best[0] if best[0] != "?" else ""):
                    best = (mnt, fstype, dev)
    except OSError:
        pass
    return {"mount": best[0], "type": best[1], "device": best[2]}


def versions():
    v = {"python": platform.python_version()}
    for mod, key in (("numpy", "numpy"), ("torch", "torch"), ("jax", "jax"),
                     ("jaxlib", "jaxlib"), ("orbax.checkpoint", "orbax-checkpoint"),
                     ("safetensors", "safetensors"), ("matplotlib", "matplotlib"),
                     ("embstore", "embstore")):
        try:
            from importlib import metadata
            v[key] = metadata.version(key)
        except Exception:  # noqa: BLE001
            v[key] = None
    return v


def machine(data_dir, reporting):
    mem = meminfo("MemTotal")
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    u = platform.uname()
    git = {}
    try:
        root = os.path.dirname(os.path.dirname(HERE))
        git["commit"] = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"],
                                       capture_output=True, text=True).stdout.strip()
        git["dirty"] = bool(subprocess.run(["git", "-C", root, "status", "--porcelain"],
                                           capture_output=True, text=True).stdout.strip())
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu": cpu, "memory_bytes": mem,
            "kernel": f"{u.system} {u.release}", "machine": u.machine, "hostname": u.node,
            "data_dir": os.path.abspath(data_dir), "file_system": fs_of(data_dir),
            "versions": versions(), "git": git, "free_page_reporting": reporting,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


# How each restore finds its memory (see the module's docstring): the JSON key's suffix.
MEMORY = {"settled": "", "backed": "_backed"}


def restore_once(o, name, res, work, key, chain, memory, run, timeout, log):
    """One cold restore of the saver's full checkpoint (embstore: or its chain) under one memory
    condition; the figures go into run under key + MEMORY[memory] + '_...'."""
    k = key + MEMORY[memory]
    drop_cache(res["full_path"])
    if memory == "settled" and o.settle > 0:
        time.sleep(o.settle)
    resident, total = resident_bytes(res["full_path"])
    args = ["restore", "--saver", name, "--rows", o.rows, "--workdir", work,
            "--path", res["full_path"]]
    if memory == "backed":
        args += ["--back-bytes", 2 * o.rows * STATE_ROW_BYTES]
    if name == "embstore":
        args += ["--chain"] if chain else ["--version", res["version_full"]]
    rr, rerr = run_child(args, timeout, log)
    if rerr:
        run[k + "_error"] = rerr
        print(f" {k} FAILED ({rerr.splitlines()[-1] if rerr.strip() else rerr})", end="",
              flush=True)
        return
    run[k + "_cold_s"] = rr["restore_s"]
    run[k + "_verified"] = rr["verified"]
    run[k + "_peak_rss_extra_bytes"] = rr["peak_rss_extra_bytes"]
    run[k + "_extra"] = rr["extra"]
    run[k + "_cached_bytes_before"] = resident
    run[k + "_checkpoint_bytes"] = total
    run[k + "_cpu"] = rr.get("cpu")
    if memory == "backed":
        run[k + "_backing"] = rr.get("backing")
    print(f" {k} {rr['restore_s']:.3f} s{'' if rr['verified'] else ' (MISMATCH)'}", end="",
          flush=True)


def bench_savers(o, savers, log):
    from savers import SAVERS
    timeout = int(300 + o.rows / 1e6 * 200)
    runs = {s: [] for s in savers}
    for r in range(o.repeat):
        for name in savers:
            work = os.path.join(o.dir, f"{SAVERS[name].__name__}-r{r}")
            shutil.rmtree(work, ignore_errors=True)
            print(f"  [{r + 1}/{o.repeat}] {name}: save ...", end="", flush=True)
            t0 = time.time()
            res, err = run_child(["save", "--saver", name, "--rows", o.rows, "--seed", 1000 + r,
                                  "--workdir", work], timeout, log)
            run = {"repeat": r}
            if err:
                run["error"] = err
                print(f" FAILED ({err.splitlines()[-1] if err.strip() else err})")
                runs[name].append(run)
                shutil.rmtree(work, ignore_errors=True)
                continue
            run.update(res)
            print(f" full {res['full_s']:.3f} s, delta {res['delta_s']:.3f} s; restore ...",
                  end="", flush=True)
            restores = [("restore", False)]
            if name == "embstore":
                restores.append(("restore_chain", True))  # the full and its delta
            for key, chain in restores:
                for memory in MEMORY:
                    restore_once(o, name, res, work, key, chain, memory, run, timeout, log)
            print(f"  ({time.time() - t0:.0f} s)")
            runs[name].append(run)
            shutil.rmtree(work, ignore_errors=True)

    out = {}
    for name in savers:
        rs = runs[name]
        ok = [x for x in rs if "error" not in x]
        entry = {"notes": SAVERS[name].notes, "synchronous": SAVERS[name].sync, "runs": rs}
        if not ok:
            entry["status"] = "failed"
            entry["error"] = rs[0].get("error") if rs else "not run"
            out[name] = entry
            continue
        entry["status"] = "ok" if len(ok) == len(rs) else "partly failed"
        entry["full_s"] = median([x["full_s"] for x in ok])
        entry["delta_s"] = median([x["delta_s"] for x in ok])
        entry["stall_s"] = median([x["full_stall_s"] for x in ok])
        entry["delta_stall_s"] = median([x["delta_stall_s"] for x in ok])
        entry["restore_cold_s"] = median([x.get("restore_cold_s") for x in ok])
        entry["restore_backed_cold_s"] = median([x.get("restore_backed_cold_s") for x in ok])
        for k in ("restore", "restore_backed"):
            for t in ("user_s", "system_s"):
                entry[f"{k}_{t}"] = median([(x.get(k + "_cpu") or {}).get(t) for x in ok])
        entry["peak_rss_extra_bytes"] = median([x["full_peak_rss_extra_bytes"] for x in ok])
        entry["delta_peak_rss_extra_bytes"] = median(
            [x["delta_peak_rss_extra_bytes"] for x in ok])
        entry["restore_peak_rss_extra_bytes"] = median(
            [x.get("restore_peak_rss_extra_bytes") for x in ok])
        entry["bytes_on_disk"] = median([x["full_bytes_on_disk"] for x in ok])
        entry["delta_bytes_on_disk"] = median([x["delta_bytes_on_disk"] for x in ok])
        # True only when restores ran and every one compared equal; a failed one is in errors.
        flags = [x[k + "_verified"] for x in ok for k in ("restore", "restore_backed")
                 if k + "_verified" in x]
        entry["restore_verified"] = bool(flags) and all(flags)
        if name == "embstore":
            entry["restore_chain_cold_s"] = median([x.get("restore_chain_cold_s") for x in ok])
            entry["restore_chain_backed_cold_s"] = median(
                [x.get("restore_chain_backed_cold_s") for x in ok])
        errs = [x[k] for x in rs for k in x if k.endswith("_error") or k == "error"]
        if errs:
            entry["errors"] = errs
        for k in ("full_s", "delta_s", "stall_s", "restore_cold_s", "restore_backed_cold_s"):
            entry[k + "_runs"] = [x.get(k if k != "stall_s" else "full_stall_s") for x in ok]
        out[name] = entry
    return out


def bench_train(o, log):
    timeout = 1800
    runs = {"torch": [], "embstore": []}
    for r in range(o.train_repeat):
        for variant in ("torch", "embstore"):
            print(f"  [{r + 1}/{o.train_repeat}] training step, {variant} ...", end="", flush=True)
            res, err = run_child(["train", "--variant", variant, "--train-rows", o.train_rows,
                                  "--batch", o.batch, "--train-steps", o.train_steps,
                                  "--warmup", o.warmup, "--seed", 7, "--threads",
                                  os.cpu_count()], timeout, log)
            if err:
                print(f" FAILED ({err.splitlines()[-1] if err.strip() else err})")
                runs[variant].append({"repeat": r, "error": err})
            else:
                print(f" {res['steps_per_s']:.2f} steps/s")
                runs[variant].append(dict(res, repeat=r))
    out = {"model": "DLRM-like: 4 sparse features (tables of --train-rows rows, dim 64, Zipf "
                    "s=1.05 ids, bags of 8, sum; a new batch every step), bottom MLP 13-512-256-64, top MLP "
                    "320-512-256-1, BCE loss, Adagrad lr 0.01 eps 1e-10 everywhere",
           "batch": o.batch, "table_rows": o.train_rows, "steps": o.train_steps,
           "warmup": o.warmup, "threads": os.cpu_count(),
           "embstore": "embstore.torch.EmbeddingBag (fused Adagrad in backward), Store('host', "
                       "host_threads=0); torch.optim.Adagrad for the MLPs",
           "torch": "nn.EmbeddingBag(sparse=True) + torch.optim.Adagrad; torch.optim.Adagrad "
                    "for the MLPs"}
    for variant, rs in runs.items():
        ok = [x for x in rs if "error" not in x]
        out[variant + "_runs"] = rs
        out[variant + "_steps_per_s"] = median([x["steps_per_s"] for x in ok])
        if not ok:
            out[variant + "_error"] = rs[0]["error"] if rs else "not run"
    return out


def goals(savers, train):
    """The goal ratios, from this run's medians (> 1: embstore faster)."""
    emb = savers.get("embstore", {})
    peers = {n: e for n, e in savers.items() if n != "embstore" and e.get("status") != "failed"}
    g = {}

    def fastest(key):
        c = [(e[key], n) for n, e in peers.items() if e.get(key) is not None]
        return min(c) if c else (None, None)

    for goal, key, label in (("full", "full_s", "full_checkpoint_speedup_vs_fastest_peer"),
                             ("delta", "delta_s", "delta_speedup_vs_fastest_peer_resave"),
                             ("restore", "restore_cold_s",
                              "restore_speedup_vs_fastest_peer_cold_load"),
                             ("restore", "restore_backed_cold_s",
                              "restore_speedup_vs_fastest_peer_cold_load_backed_memory")):
        best, who = fastest(key)
        mine = emb.get(key)
        ratio = best / mine if best is not None and mine else None
        g[label] = {"ratio": ratio, "goal": GOALS[goal], "met": None if ratio is None else
                    ratio >= GOALS[goal], "embstore_s": mine, "fastest_peer": who,
                    "fastest_peer_s": best}
    for key, label in (("restore_cold_s", "restore_speedup_vs_numpy_cold_load"),
                       ("restore_backed_cold_s",
                        "restore_speedup_vs_numpy_cold_load_backed_memory")):
        npy = savers.get("numpy", {}).get(key)
        mine = emb.get(key)
        g[label] = {
            "ratio": npy / mine if npy and mine else None, "goal": GOALS["restore"],
            "met": None if not (npy and mine) else npy / mine >= GOALS["restore"],
            "embstore_s": mine, "numpy_s": npy}
    if train:
        e, t = train.get("embstore_steps_per_s"), train.get("torch_steps_per_s")
        ratio = e / t if e and t else None
        g["train_steps_per_s_ratio_vs_nn_embeddingbag_sparse_adagrad"] = {
            "ratio": ratio, "goal": GOALS["train"],
            "met": None if ratio is None else ratio >= GOALS["train"],
            "embstore_steps_per_s": e, "torch_steps_per_s": t}
    return g


def fmt(x, unit=""):
    if x is None:
        return "-"
    if unit == "MB":
        return f"{x / 1e6:,.0f}"
    return f"{x:.3f}" if x < 100 else f"{x:.1f}"


def table(report):
    lines = []
    hdr = ("saver", "full s", "1% delta s", "stall s", "restore s", "backed s", "peak +MB",
           "disk MB", "status")
    w = (15, 9, 11, 9, 10, 9, 9, 9, 8)
    lines.append("  ".join(h.ljust(n) if i == 0 else h.rjust(n) for i, (h, n) in
                           enumerate(zip(hdr, w))))
    for name, e in report["savers"].items():
        row = (name, fmt(e.get("full_s")), fmt(e.get("delta_s")), fmt(e.get("stall_s")),
               fmt(e.get("restore_cold_s")), fmt(e.get("restore_backed_cold_s")),
               fmt(e.get("peak_rss_extra_bytes"), "MB"),
               fmt(e.get("bytes_on_disk"), "MB"), e.get("status", "?"))
        lines.append("  ".join(c.ljust(n) if i == 0 else c.rjust(n) for i, (c, n) in
                               enumerate(zip(row, w))))
    d = report.get("disk_baseline") or {}
    if d:
        lines.append("")
        lines.append("disk, the same bytes sequentially (before / after): write+fsync " +
                     " / ".join(f"{d[k]['write_fsync_s']:.3f} s" for k in ("before", "after")
                                if k in d) + ", cold read " +
                     " / ".join(f"{d[k]['read_cold_s']:.3f} s" for k in ("before", "after")
                                if k in d))
    tr = report.get("train")
    if tr:
        lines.append("")
        lines.append(f"training step (batch {tr['batch']}, {tr['table_rows']:,} rows x 4 "
                     f"tables): nn.EmbeddingBag(sparse)+Adagrad "
                     f"{fmt(tr.get('torch_steps_per_s'))} steps/s, embstore "
                     f"{fmt(tr.get('embstore_steps_per_s'))} steps/s")
    lines.append("")
    for k, g in report["goals"].items():
        r = g["ratio"]
        met = {True: "met", False: "NOT met", None: "n/a"}[g["met"]]
        who = f" ({g['fastest_peer']})" if g.get("fastest_peer") else ""
        lines.append(f"{k}{who}: {'-' if r is None else f'{r:.2f}x'} (goal >= {g['goal']}x, "
                     f"{met})")
    return "\n".join(lines)


def plot(report, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    savers = report["savers"]
    names = list(savers)
    panels = [("full_s", "full checkpoint until durable (s)"),
              ("delta_s", "after changing 1% of the rows (s)\n(peers rewrite everything)"),
              ("stall_s", "training thread blocked by the full save (s)"),
              (("restore_cold_s", "restore_backed_cold_s"),
               "restore from a cold page cache (s):\nmemory settled (dark) / backed (light)"),
              ("peak_rss_extra_bytes", "peak memory above the state (MB)")]
    fig, axes = plt.subplots(2, 3, figsize=(17, 9.5))
    axes = axes.ravel()
    for ax, (keys, title) in zip(axes, panels):
        keys = keys if isinstance(keys, tuple) else (keys,)
        mb = keys[0].endswith("bytes")
        width = 0.8 / len(keys)
        series = []
        for j, key in enumerate(keys):
            vals = [savers[n].get(key) for n in names]
            ys = [(v / 1e6 if mb else v) if v is not None else 0 for v in vals]
            shade = ("#e6550d", "#6baed6") if j == 0 else ("#fdae6b", "#c6dbef")
            colors = [shade[0] if n == "embstore" else shade[1] for n in names]
            xs = [i + (j - (len(keys) - 1) / 2) * width for i in range(len(names))]
            series.append((ax.bar(xs, ys, width=width, color=colors), vals, ys))
        pos = [y for _, _, ys in series for y in ys if y > 0]
        if not mb and pos and max(pos) / min(pos) > 20:
            ax.set_yscale("log")
        for bars, vals, ys in series:
            for b, v, y in zip(bars, vals, ys):
                label = "failed" if v is None else (f"{y:,.0f}" if mb else
                                                     (f"{y:.3g}" if y < 1000 else f"{y:,.0f}"))
                ax.annotate(label, (b.get_x() + b.get_width() / 2,
                                    max(y, min(pos) if pos else 1)),
                            ha="center", va="bottom", fontsize=8 if len(keys) == 1 else 6.5,
                            xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=9)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3, which="both")
    ax = axes[5]
    tr = report.get("train")
    if tr:
        labels = ["nn.EmbeddingBag\n(sparse) + Adagrad", "embstore.torch\nEmbeddingBag"]
        ys = [tr.get("torch_steps_per_s") or 0, tr.get("embstore_steps_per_s") or 0]
        bars = ax.bar([0, 1], ys, color=["#6baed6", "#e6550d"])
        for b, y in zip(bars, ys):
            ax.annotate(f"{y:.2f}" if y else "failed", (b.get_x() + b.get_width() / 2, y),
                        ha="center", va="bottom", fontsize=9, xytext=(0, 2),
                        textcoords="offset points")
        ax.set_xticks([0, 1])
        ax.set_xticklabels(labels, fontsize=9)
        ax.set_title(f"DLRM-like training steps/s on the CPU (batch {tr['batch']})", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    else:
        ax.axis("off")
    m = report["machine"]
    fig.suptitle(f"embstore vs peers: {report['rows']:,} rows x 64, keys + values + Adagrad "
                 f"state ({report['state_bytes'] / 1e9:.2f} GB); {m['cores']} cores, "
                 f"{m['file_system']['type']}, median of {report['repeat']}", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def driver(o):
    from savers import ORDER, SAVERS
    savers = ORDER if not o.savers else [s.strip() for s in o.savers.split(",") if s.strip()]
    for s in savers:
        if s not in SAVERS:
            print(f"bench_peers: unknown saver {s!r} (one of {', '.join(ORDER)})",
                  file=sys.stderr)
            return 2
    os.makedirs(o.dir, exist_ok=True)
    os.makedirs(o.out, exist_ok=True)
    base = os.path.join(os.path.abspath(o.out), f"bench-peers-r{o.rows}")
    log = base + ".log"
    open(log, "w").close()
    state_bytes = o.rows * STATE_ROW_BYTES
    print(f"bench_peers: {o.rows:,} rows ({state_bytes / 1e9:.2f} GB of state), "
          f"{o.repeat} repeat(s), data in {o.dir}; children's output in {log}")
    print(f"  free page reporting (VM): {o.reporting}; restores settle {o.settle} s")
    t0 = time.time()
    report = {"benchmark": "embstore bench-peers", "rows": o.rows, "dim": 64,
              "state_bytes": state_bytes, "repeat": o.repeat, "quick": o.quick,
              "machine": machine(o.dir, o.reporting),
              "method": {
                  "durable": "data files and their directories fsynced (by the saver, or by "
                             "the benchmark inside the timed span)",
                  "stall": "synchronous savers: the whole save; DCP async_save: until it "
                           "returns; Orbax: until save() returns; embstore: until checkpoint() "
                           "returns plus checkpoint_info().stall_seconds",
                  "delta": "1% of the rows (random) changed (peers: +1e-3 on values and "
                           "accumulators; embstore: apply_gradients on those keys), then peers "
                           "save everything into a new directory, embstore an incremental "
                           "checkpoint",
                  "restore_cold": "fsync + posix_fadvise(DONTNEED) on every file of the full "
                                  "checkpoint, then a fresh process loads it into memory "
                                  "(timed: the load call, plus a read of every page where the "
                                  "loader maps the file); sampled rows compared",
                  "restore_memory": f"each restore twice: settled (after {o.settle} s idle, "
                                    "in which a VM with free page reporting hands the memory "
                                    "freed before back to its host: every first touch then "
                                    "costs a host fault) and backed (the child first touches "
                                    "and frees twice the state's bytes, so the load takes "
                                    "pages the host backs, as off a VM)",
                  "peak_memory": "in each save child: peak RSS during the full save above its "
                                 "RSS after building the state",
                  "processes": "each save, each restore and each training run in its own "
                               "fresh process"}}
    # The file system's own sequential speed for the same bytes, before and after the savers
    # (a virtual disk's write cache can make it change with recent writes).
    report["disk_baseline"] = {"before": disk_baseline(o.dir, state_bytes)}
    b = report["disk_baseline"]["before"]
    print(f"  disk: write+fsync {b['write_GBps']:.2f} GB/s, cold read {b['read_GBps']:.2f} GB/s")
    report["savers"] = bench_savers(o, savers, log)
    report["disk_baseline"]["after"] = disk_baseline(o.dir, state_bytes)
    report["train"] = None if o.no_train else bench_train(o, log)
    report["goals"] = goals(report["savers"], report["train"])
    report["elapsed_seconds"] = time.time() - t0
    with open(base + ".json", "w") as f:
        json.dump(report, f, indent=1)
    try:
        plot(report, base + ".png")
    except Exception:  # noqa: BLE001 - the JSON is the record; the plot is a view of it
        traceback.print_exc()
        print("bench_peers: the plot failed", file=sys.stderr)
    print()
    print(table(report))
    print()
    print(f"json: {base}.json")
    print(f"png:  {base}.png")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", choices=("save", "restore", "train"))
    p.add_argument("--rows", type=int)
    p.add_argument("--dir", default="/var/tmp/embstore-bench-peers")
    p.add_argument("--out", default="perf-results/peers")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeat", type=int)
    p.add_argument("--savers", help="comma-separated subset of the savers")
    p.add_argument("--no-train", action="store_true")
    p.add_argument("--train-rows", type=int, default=1_000_000)
    p.add_argument("--train-steps", type=int)
    p.add_argument("--train-repeat", type=int)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--settle", type=float,
                   help="seconds idle before each settled restore (default: 30, --quick 10, "
                        "where the VM reports free pages to its host; else 0)")
    # children's
    p.add_argument("--saver")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir")
    p.add_argument("--path")
    p.add_argument("--version", type=int)
    p.add_argument("--chain", action="store_true")
    p.add_argument("--back-bytes", type=int, default=0)
    p.add_argument("--variant")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--result")
    o = p.parse_args(argv)
    if o.child:
        try:
            r = {"save": child_save, "restore": child_restore, "train": child_train}[o.child](o)
        except BaseException:  # noqa: BLE001 - reported to the driver
            r = {"error": traceback.format_exc()}
        with open(o.result, "w") as f:
            json.dump(r, f)
        # A saver's background threads (Orbax, DCP) must not hold the process open.
        sys.stdout.flush()
        os._exit(0 if "error" not in r else 1)
    if o.rows is None:
        o.rows = 1_000_000 if o.quick else 10_000_000
    if o.repeat is None:
        o.repeat = 3 if o.quick else 1
    if o.train_steps is None:
        o.train_steps = 100 if o.quick else 200
    if o.train_repeat is None:
        o.train_repeat = 3
    o.reporting = free_page_reporting()
    if o.settle is None:
        # Where it cannot be told whether the VM reports free pages, settle as if it did.
        o.settle = (10 if o.quick else 30) if o.reporting is not False else 0
    if not math.isfinite(o.settle) or o.settle < 0:
        p.error("--settle must be a number of seconds, 0 or more")
    for name in ("rows", "repeat", "train_rows", "train_steps", "train_repeat", "batch"):
        if getattr(o, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return driver(o)


if __name__ == "__main__":
    sys.exit(main())
