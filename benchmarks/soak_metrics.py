"""What the soak measures of a server process, from /proc, and the numbers it judges them by:
resource counts before and after a run (what leaked), and whether RSS stayed flat."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# the counts a run must leave as it found them (besides the sessions and slots the servers report)
COUNTS = ("fds", "threads")


@dataclass(slots=True, frozen=True)
class ProcSnapshot:
    rss_kb: int  # VmRSS
    fds: int  # open file descriptors (/proc/PID/fd)
    threads: int  # /proc/PID/task
    cpu_s: float  # user + system time so far

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ValueError(f"/proc/{pid}/status has no VmRSS line")


def cpu_seconds(pid: int) -> float:
    # the command name (field 2) may hold spaces and parentheses: split after its last ')'
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14, 15)


def snapshot(pid: int) -> ProcSnapshot:
    return ProcSnapshot(
        rss_kb=rss_kb(pid),
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=len(os.listdir(f"/proc/{pid}/task")),
        cpu_s=cpu_seconds(pid),
    )


_TCP_STATES = {"01": "established", "02": "syn-sent", "03": "syn-recv", "04": "fin-wait1",
               "05": "fin-wait2", "06": "time-wait", "07": "close", "08": "close-wait",
               "09": "last-ack", "0A": "listen", "0B": "closing"}


def _socket_kinds(pid: int) -> dict[str, str]:
    """Socket inode -> what it is (``tcp established``, ``udp``, ``unix``), from the
    process's network namespace tables."""
    kinds: dict[str, str] = {}
    for table in ("tcp", "tcp6", "udp", "udp6", "unix"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if table == "unix":
                if len(f) >= 7:
                    kinds[f[6]] = "unix"
            elif len(f) >= 10:
                kinds[f[9]] = f"{table.rstrip('6')} {_TCP_STATES.get(f[3], f[3])}" \
                    if table.startswith("tcp") else "udp"
    return kinds


def fd_kinds(pid: int) -> dict[str, int]:
    """The open descriptors by kind (a leak's kind says where to look): sockets by protocol
    and TCP state, pipes, event fds, epoll, devices, files."""
    sockets = _socket_kinds(pid)
    counts: dict[str, int] = {}
    base = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(base):
        try:
            target = os.readlink(base / fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            kind = sockets.get(target[8:-1], "socket")
        elif target.startswith("pipe:"):
            kind = "pipe"
        elif target.startswith("anon_inode:"):
            kind = target[11:].strip("[]")
        elif target.startswith("/dev/"):
            kind = "device"
        else:
            kind = "file"
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))


def grown(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The kinds there are more of after than before, and by how many."""
    return {k: n - before.get(k, 0) for k, n in after.items() if n > before.get(k, 0)}


def leaked(before: dict[str, int | None], after: dict[str, int | None]) -> dict[str, int | None]:
    """What a run left behind, count by count: ``after - before``, never below 0 (fewer is not
    a leak); None where either side was not measured."""
    out: dict[str, int | None] = {}
    for key, b in before.items():
        a = after.get(key)
        out[key] = None if a is None or b is None else max(0, a - b)
    return out


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing means over ``window`` values (shorter at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def rss_flatness(samples: list[tuple[float, float]], start: float, end: float,
                 window: int = 6) -> dict[str, Any]:
    """How flat RSS stayed over the second half of ``[start, end]`` (seconds, the calling
    period), from ``(t, rss)`` samples:

    * ``drift_pct``: the least-squares line through the second half's samples, its rise from
      the half's start to its end as % of its value at the start (what the 2% bar judges:
      noise averages out, steady growth does not);
    * ``spread_pct``: max/min - 1 of the ``window``-sample trailing mean over the same half,
      in % (the largest swing, whatever its shape).

    Fewer than 3 samples in the half give None for both."""
    mid = start + (end - start) / 2
    half = [(t, v) for t, v in samples if mid <= t <= end]
    result: dict[str, Any] = {"from_s": round(mid - start, 1), "to_s": round(end - start, 1),
                              "samples": len(half), "drift_pct": None, "spread_pct": None}
    if len(half) < 3:
        return result
    ts = [t for t, _ in half]
    vs = [v for _, v in half]
    n = len(half)
    t_mean = sum(ts) / n
    v_mean = sum(vs) / n
    var = sum((t - t_mean) ** 2 for t in ts)
    slope = sum((t - t_mean) * (v - v_mean) for t, v in half) / var if var else 0.0
    at_start = v_mean + slope * (ts[0] - t_mean)
    result["drift_pct"] = round(100 * slope * (ts[-1] - ts[0]) / at_start, 3)
    smooth = moving_average(vs, window)
    result["spread_pct"] = round(100 * (max(smooth) / min(smooth) - 1), 3)
    return result
