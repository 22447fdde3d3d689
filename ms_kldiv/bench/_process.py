"""What the benchmark subcommands share: each row runs in a child process of its own (so that its peak memory is
its own), timed here, its record handed back as one JSON line."""
import gc
import json
import os
import subprocess
import sys
import time


def _reset_peak():
    try:  # Linux: "5" resets VmHWM (the peak resident set) to the current resident set
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _read_kb(path, key):
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_bytes():
    """Memory the machine can still give (MemAvailable), or None where unknown."""
    return _read_kb("/proc/meminfo", "MemAvailable")


def measure(step, repeats):
    """Run ``step`` once (compile, warm-up) then ``repeats`` times: (best seconds, the first call's extra seconds,
    peak resident bytes above what existed before the first call, or None where the OS cannot say). MindSpore's
    memory pool keeps what a step allocated, so the peak is taken from before the first call (compile included,
    the same for every row)."""
    gc.collect()
    base = _read_kb("/proc/self/status", "VmRSS")
    peak_ok = _reset_peak() and base is not None
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak = _read_kb("/proc/self/status", "VmHWM") - base if peak_ok else None
    return min(times), max(0.0, first - min(times)), peak


def in_child(module, args, row):
    """``python -m module --child *args`` in a child process; its last JSON line, or {'row', 'error'}."""
    cmd = [sys.executable, "-m", module, "--child"] + [str(a) for a in args]
    env = dict(os.environ, GLOG_v=os.environ.get("GLOG_v", "3"))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    for line in proc.stdout.splitlines()[::-1]:
        if line.startswith("{"):
            return json.loads(line)
    return {"row": row, "error": (proc.stderr or proc.stdout)[-400:].strip().splitlines()[-1:]}


def fmt_bytes(b, unit=2**30, suffix="GB"):
    return "-" if b is None else f"{b / unit:.2f} {suffix}"


def save_records(path, records):
    """The records as JSON at ``path`` (nothing when ``path`` is None)."""
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(records, f, indent=1)


def rows_to_run(spec):
    """The row keys of ``spec`` (a list, or comma-separated), less 'torch' where torch cannot be imported."""
    rows = [r for r in (spec.split(",") if isinstance(spec, str) else spec) if r]
    if "torch" in rows:
        try:
            import torch  # noqa: F401  (imported before timing: its OpenMP runtime is then loaded)
        except ImportError:
            rows.remove("torch")
    return rows


def print_row(*cells):
    """One Markdown table row; a record with an error fills the row with it."""
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)
