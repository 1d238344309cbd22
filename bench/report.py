"""Markdown output: machine, command, the results table, py-spy hot spots."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import time
from pathlib import Path

from bench.harness import ROOT, Row, fmt, med, spread

KEEP_MARKER = "<!-- Everything below this line is hand-written and kept when bench rewrites this file. -->"


def table(rows: list[Row]) -> str:
    out = [
        "| workload | unit | kbroker median (min-max) | peer median (min-max) | kbroker/peer | "
        "kbroker CPU us/msg | peer CPU us/msg | kbroker peak RSS MB | target | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ratio = r.ratio()
        rss = med(r.kb_rss_mb)
        note = f" <br>*{r.note.strip()}*" if r.note.strip() else ""
        out.append(
            f"| {r.workload}{note} | {r.metric} | {spread(r.kb)} | {spread(r.peer) if r.peer else 'n/a'} | "
            f"{'-' if ratio is None else f'{ratio:.2f}'} | {spread(r.kb_cpu_us) if r.kb_cpu_us else '-'} | "
            f"{spread(r.peer_cpu_us) if r.peer_cpu_us else '-'} | {fmt(rss) if rss is not None else '-'} | "
            f"{r.target} | {r.verdict()} |"
        )
    return "\n".join(out)


def peers_table(rows: list[Row]) -> str:
    """The rows Apache Kafka or Tansu ran in: every broker's median side by side, kbroker's ratio to each Kafka,
    broker CPU per message and peak RSS of each."""
    rows = [r for r in rows if r.others]
    names = sorted({n for r in rows for n in r.others}, key=lambda n: (not n.startswith("Kafka"), n))
    if not rows:
        return ""
    kafkas = [n for n in names if n.startswith("Kafka")]
    head = (["workload", "unit", "kbroker", *names, "mock"] + [f"kbroker/{n}" for n in kafkas]
            + ["CPU us/msg: kbroker / " + " / ".join(names) + " / mock",
               "peak RSS MB: kbroker / " + " / ".join(names)])
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cpu = [spread(r.kb_cpu_us) if r.kb_cpu_us else "-"]
        cpu += [fmt(med(r.others_cpu_us.get(n, []))) for n in names]
        cpu.append(fmt(med(r.peer_cpu_us)))
        rss = [fmt(med(r.kb_rss_mb))] + [fmt(med(r.others_rss_mb.get(n, []))) for n in names]
        ratios = []
        for n in kafkas:
            q = r.ratio_to(n)
            ratios.append("-" if q is None else f"{q:.2f}")
        cells = ([r.workload, r.metric, spread(r.kb)] + [spread(r.others.get(n, [])) for n in names]
                 + [spread(r.peer) if r.peer else "n/a"] + ratios + [" / ".join(cpu), " / ".join(rss)])
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _short(frame: str) -> str:
    """'handle (/work/main/broker/network.py:123)' -> 'broker/network.py:handle'."""
    m = re.match(r"(.*) \((.*?)(?::\d+)?\)$", frame)
    if not m:
        return frame
    func, path = m.group(1), m.group(2)
    root = str(ROOT) + "/"
    if path.startswith(root):
        path = path[len(root):]
    else:
        path = re.sub(r".*/(site-packages|lib/python3\.\d+)/", r"<\1>/", path)
    return f"{path}:{func}"


def hotspots(raw_path: str, top: int = 15) -> str:
    """Self (leaf) and inclusive sample shares per file:function from py-spy's raw (collapsed stack) output."""
    selfc: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    try:
        lines = Path(raw_path).read_text().splitlines()
    except OSError:
        return "(no py-spy output)"
    for line in lines:
        stack, _, cnt = line.rpartition(" ")
        if not stack or not cnt.isdigit():
            continue
        c = int(cnt)
        frames = [_short(f) for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += c
        selfc[frames[-1]] += c
        for f in set(frames):
            incl[f] += c
    if not total:
        return "(no samples)"
    ours = ("broker/", "storage/", "protocol/", "coordinator/")
    out = [f"{total} samples (GIL holder only: where Python time goes).", "",
           "| self % | function (leaf frame) | | inclusive % | kbroker function (incl. callees) |",
           "| --- | --- | --- | --- | --- |"]
    s_items = selfc.most_common(top)
    i_items = [(f, c) for f, c in incl.most_common() if f.startswith(ours)][:top]
    for k in range(max(len(s_items), len(i_items))):
        a = s_items[k] if k < len(s_items) else ("", 0)
        b = i_items[k] if k < len(i_items) else ("", 0)
        out.append(f"| {100 * a[1] / total:.1f} | `{a[0]}` | | {100 * b[1] / total:.1f} | `{b[0]}` |"
                   if a[0] and b[0] else
                   f"| {100 * a[1] / total:.1f} | `{a[0]}` | | | |" if a[0] else
                   f"| | | | {100 * b[1] / total:.1f} | `{b[0]}` |")
    return "\n".join(out)


def perf_summary(data: str, top: int = 20) -> str:
    """Share of CPU samples by shared object and by symbol (self), from `perf report`."""
    if not Path(data).exists():
        return "(no perf data)"

    def rep(sort: str) -> list[tuple[str, str]]:
        try:
            out = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "-g", "none",
                                  "--sort", sort], capture_output=True, text=True, timeout=120).stdout
        except Exception:  # noqa: BLE001
            return []
        rows = []
        for line in out.splitlines():
            m = re.match(r"\s*([\d.]+)%\s+(.*)$", line)
            if m:
                rows.append((m.group(1), " ".join(m.group(2).split())))
        return rows

    dsos = rep("dso")
    syms = rep("dso,sym")[:top]
    if not dsos:
        return "(perf report produced nothing)"
    out = ["By shared object: " + ", ".join(f"{d} {p}%" for p, d in dsos[:8]), "",
           "| self % | shared object, symbol |", "| --- | --- |"]
    out += [f"| {p} | `{s}` |" for p, s in syms]
    return "\n".join(out)


def git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        return "?"


def render(rows: list[Row], command: str, started: float, elapsed: float, info: dict[str, str],
           load_end: str, profiles: dict[str, tuple[str, str]], skipped: list[str], quick: bool, reps: int,
           unavailable: dict[str, str] | None = None, peers_note: str = "") -> str:
    date = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started))
    parts = [
        "# kbroker benchmark results" + (" (--quick smoke run)" if quick else ""),
        "",
        f"- date: {date}; kbroker commit {git_rev()}; wall time {elapsed:.0f} s",
        f"- command: `{command}`",
        f"- machine: {info['nproc']} CPUs ({info['cpu']}), {info['ram']} RAM, Python {info['python']}; "
        f"load average at start {info['load']}, at end {load_end}; produce record walk: {info['record_walk']}",
        f"- page cache (`python -m bench.page_cache`, before the workloads): {info.get('page_cache', 'not measured')}; "
        "kbroker writes every produced byte into new pages, the mock keeps data in memory it reuses",
        f"- loopback round trip (`python -m bench.round_trip`, before the workloads): "
        f"{info.get('round_trip', 'not measured')}: the floor under any broker's CPU per request",
        "- peer: librdkafka's mock cluster (in-memory C, one I/O thread; /work/shared/bench-peers), "
        "same topics (4 partitions each) and the same client settings",
        f"- each figure: median of {reps} repetition(s) (min-max), kbroker and peer alternating (A/B/A/B); "
        "CPU = broker process CPU time delta per message (its CPU-time clock, ns); "
        "peak RSS = VmHWM of the kbroker process at the end of the workload",
        "- clients run on the same machine and compete with the broker for the 2 cores: throughput figures are "
        "client-bound where the peer is too",
        "",
        table(rows),
        "",
    ]
    beside = peers_table(rows)
    if beside or unavailable:
        parts += ["## Beside Apache Kafka and Tansu (same run, same clients and settings, alternating)", ""]
        if peers_note:
            parts += [peers_note, ""]
        if beside:
            parts += [beside, ""]
        for name, why in (unavailable or {}).items():
            parts += [f"- {name}: no figures: {why}"]
        parts += [""]
    if skipped:
        parts += ["Skipped (time budget): " + "; ".join(skipped), ""]
    if profiles:
        parts += ["## Profiles of kbroker (untimed extra runs, after the measured repetitions)", "",
                  "py-spy `record --gil` at 1000 Hz samples only the thread holding the GIL (uvloop's epoll wait "
                  "is not told apart from work otherwise; py-spy's blocking sampler also undercounts), "
                  "perf `record -F 999 -g` shows native and kernel time (Python 3.11 frames appear as "
                  "_PyEval_EvalFrameDefault).", ""]
        for name, (spy, perf) in profiles.items():
            parts += [f"### {name}", "", "py-spy:", "", hotspots(spy), "", "perf:", "", perf_summary(perf), ""]
    return "\n".join(parts)


def write(path: Path, text: str) -> None:
    keep = ""
    if path.exists():
        old = path.read_text()
        if KEEP_MARKER in old:
            keep = old[old.index(KEEP_MARKER):]
    if not keep:
        keep = KEEP_MARKER + "\n"
    path.write_text(text.rstrip() + "\n\n" + keep)
    os.chmod(path, 0o644)
