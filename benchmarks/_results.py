"""Shared helpers for benchmark scripts: timing, tables and the RESULTS.md sections.

Each benchmark owns one section of benchmarks/RESULTS.md, delimited by HTML comments, and
rewrites only that section, so scripts can be re-run independently.
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "RESULTS.md")
OUT_DIR = os.path.join(HERE, "out")

sys.path.insert(0, os.path.dirname(HERE))
from rewrite.persist.atomic import atomic_write_text  # noqa: E402


def cold_caches() -> None:
    """Compile times are cold: Inductor's FX graph cache off and its C++ kernel cache, like rewrite's
    static-kernel cache ($XDG_CACHE_HOME/rewrite/kernels), in fresh folders of this run."""
    torch._inductor.config.fx_graph_cache = False
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-inductor-")
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="bench-xdg-")


def time_call(fn, *args, warmup: int = 3, repeat: int = 20, inner: int = 1) -> float:
    """Median seconds per call of ``fn(*args)``."""
    for _ in range(warmup):
        fn(*args)
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn(*args)
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def rss_reset() -> int | None:
    """Reset the process's peak RSS (Linux) and return the RSS now, in bytes; None where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return status_kb("VmRSS") * 1024
    except OSError:
        return None


def status_kb(field: str) -> int:
    """A kB field of /proc/self/status (``VmRSS``, ``VmHWM``: the peak since `rss_reset`)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(field)


def markdown_table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def machine_line() -> str:
    return (f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"threads {torch.get_num_threads()}, python {platform.python_version()}")


# -- a quiet machine ------------------------------------------------------------------------------------------
# On 2 cores another busy process makes OpenMP threads oversubscribe and times swing 10x within one run: a
# figure measured under load says nothing. The load average cannot tell (the benchmark itself loads the
# machine), so the CPU time of every process outside this benchmark's process tree is counted instead.

BUSY_CORES = 0.15  # other processes may use at most this share of one core, averaged over the run


def _process_times() -> dict[int, tuple[int, float]]:
    """{pid: (parent pid, CPU seconds)} of every process this user can see (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return out


def _others_cpu_seconds() -> dict[int, float]:
    """{pid: CPU seconds so far} of the processes outside this process's tree (its children are its own work)."""
    times = _process_times()
    ours = {os.getpid()}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _) in times.items():
            if ppid in ours and pid not in ours:
                ours.add(pid)
                grew = True
    return {pid: cpu for pid, (_, cpu) in times.items() if pid not in ours}


class MachineWatch:
    """How busy the rest of the machine was since this benchmark started (started when this module loads)."""

    def __init__(self):
        self.load_before = os.getloadavg()
        self.t0 = time.monotonic()
        self.others0 = _others_cpu_seconds() if os.path.isdir("/proc") else None

    def others_cores(self) -> float | None:
        """Average cores used by other processes since the start (None where /proc is missing)."""
        if self.others0 is None:
            return None
        # Per process: what it used since the start (a process that ended meanwhile is not seen; one that
        # started meanwhile counts whole).
        used = sum(max(0.0, cpu - self.others0.get(pid, 0.0)) for pid, cpu in _others_cpu_seconds().items())
        return used / max(time.monotonic() - self.t0, 1e-9)

    def line(self) -> str:
        cores = self.others_cores()
        other = "unknown" if cores is None else f"{cores:.2f} cores"
        return ("load average {:.2f} {:.2f} {:.2f} before, ".format(*self.load_before)
                + "{:.2f} {:.2f} {:.2f} after; other processes used {} during the run".format(*os.getloadavg(), other))

    def busy(self) -> bool:
        cores = self.others_cores()
        return cores is not None and cores > BUSY_CORES


WATCH = MachineWatch()


def record_section(name: str, body: str, force: bool = False) -> bool:
    """Replace (or append) the section ``name`` of RESULTS.md with ``body`` and the machine's load line.

    Refused (a warning, False) when other processes were busy during the run (`MachineWatch`), unless
    ``force`` (or REWRITE_BENCH_FORCE=1): such figures must not be recorded as measurements."""
    load = WATCH.line()
    if WATCH.busy() and not (force or os.environ.get("REWRITE_BENCH_FORCE") == "1"):
        print(f"WARNING: not recording section {name!r} of RESULTS.md: the machine was busy ({load}); "
              f"rerun on a quiet machine (REWRITE_BENCH_FORCE=1 records anyway)", file=sys.stderr)
        return False
    body = body.rstrip() + f"\n\nMachine during this run: {load}.\n"
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    text = open(RESULTS).read() if os.path.exists(RESULTS) else "# Benchmark results\n\nLatest measured figures; each section is written by the script it names.\n"
    block = f"{begin}\n{body.strip()}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    atomic_write_text(RESULTS, text)
    return True


def latency_panel(ax, rows: dict, names: list, labels: list, title: str) -> None:
    """A traffic plot's latency panel: p50 and p99 per request of each contender, side by side."""
    xs, w = range(len(names)), 0.4
    ax.bar([x - w / 2 for x in xs], [rows[c]["p50"] * 1e3 for c in names], w, label="p50")
    ax.bar([x + w / 2 for x in xs], [rows[c]["p99"] * 1e3 for c in names], w, label="p99")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("ms per request")
    ax.set_title(f"{title}: latency")
    ax.legend(fontsize=7)


def save_plot(fig, filename: str) -> str:
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(HERE, filename)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path
