"""Where a decode step's time goes, from Nsight Compute: the "Where the time goes" section of
benches/results/kernels.md (issue 14: achieved bandwidth, stall reasons, shared-memory wavefronts
per tile, and what would close each missed target).

``regenerate.sh`` profiles the stage 1 of the launcher's default decode step (``profile_decode.py
--config default --mode fused``) at the target shapes under ``ncu`` and keeps each text report;
this script reads those reports and the benchmark's ``kernels.json`` of the same run and appends
the section to ``kernels.md``:

    python3 benches/kernels/ncu_report.py --bench kernels.json --append kernels.md ncu/ncu_*.txt

Per report: the profiled launch (shape, bits, kernel, grid), its duration, DRAM bandwidth (TB/s and
% of peak), L2 and L1 throughput, issue slots busy, eligible warps per scheduler, cycles between a
warp's instructions and what a warp waits on (PC sampling, ``smsp__pcsamp_warps_issue_stalled_*``:
each reason's share of the samples times the cycles per issued instruction), executed instructions
and shared-memory wavefronts per 32-token tile of context, the uncoalesced sectors ncu reports,
registers and occupancy. Then per missed decode target: the time the target needs, the time the
profiled instructions take at one instruction per scheduler per cycle and the time the step's bytes
take at the run's copy bandwidth, i.e. how far each of the two limits has to move.

Without a GPU (CI) it runs on the reports kept in benches/results (tests/test_bench_report.py).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

#: Stall reasons of PC sampling as ncu names them (``smsp__pcsamp_warps_issue_stalled_<reason>``),
#: with the words the report uses.
STALL_WORDS = {
    "long_scoreboard": "global/local memory (long scoreboard)",
    "selected": "issuing (selected)",
    "wait": "fixed-latency dependency (wait)",
    "not_selected": "eligible, not selected",
    "math_pipe_throttle": "math pipe busy (throttle)",
    "dispatch_stall": "dispatch",
    "short_scoreboard": "shared memory / MUFU (short scoreboard)",
    "mio_throttle": "memory input/output queue (mio throttle)",
    "lg_throttle": "global queue (lg throttle)",
    "barrier": "barrier",
    "branch_resolving": "branch resolving",
    "no_instructions": "no instructions (icache)",
    "imc_miss": "constant cache miss",
    "drain": "drain",
    "membar": "memory barrier",
    "sleeping": "sleeping",
    "tex_throttle": "texture throttle",
    "misc": "misc",
    "warpgroup_arrive": "warpgroup arrive",
}
SHARED_WAVEFRONTS = "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"
#: What ``regenerate.sh`` passes to ncu besides its sections (the stall samples, the shared wavefronts).
NCU_METRICS = f"regex:smsp__pcsamp_warps_issue_stalled_.*,{SHARED_WAVEFRONTS}"

_PROFILED = re.compile(r"^profiled(?: \((?P<mode>\w+)\))?: INT(?P<bits>\d+)(?: format=(?P<fmt>\w+))? B=(?P<batch>\d+) ctx=(?P<ctx>\d+) "
                       r"bn=(?P<bn>\d+) .*?splits=(?P<splits>\d+)(?P<rest>.*)$")
_KERNEL = re.compile(r"^\s+(?P<name>_\w*decode_stage1\w*) \((?P<grid>[\d, ]+)\)x\((?P<block>[\d, ]+)\)")
_SECTION = re.compile(r"^\s+Section: (?P<name>.+?)\s*$")
_ROW = re.compile(r"^\s{4}(?P<name>\S.*?)\s{2,}(?:(?P<unit>\S+(?: \S+)?)\s{2,})?(?P<value>-?[\d,]+(?:\.\d+)?|n/a|no data)\s*$")
_EXCESS_SECTORS = re.compile(r"excessive sectors \((?P<pct>\d+)% of the total (?P<total>[\d,]+) sectors\)")


class NcuReportError(ValueError):
    """A report that is not an Nsight Compute text report of a decode stage 1 (says what is missing)."""


@dataclass
class Profile:
    """One ncu text report of one stage-1 launch."""

    path: str
    mode: str
    bits: int
    batch: int
    ctx: int
    block_n: int
    splits: int
    kernel: str
    variant: str
    grid: tuple[int, ...]
    metrics: dict[tuple[str, str], float] = field(default_factory=dict)
    units: dict[tuple[str, str], str] = field(default_factory=dict)
    stalls: dict[str, float] = field(default_factory=dict)
    excessive_sectors_pct: float | None = None
    #: the pool's key-range format (profile_decode.py --format): "group" (the paper's) or "page" (the
    #: INT2 server default); reports from before the option are "group"
    fmt: str = "group"

    @property
    def label(self) -> str:
        """The bits column: ``2``, or ``2 (page)`` for the INT2 server default's format."""
        return f"{self.bits}" if self.fmt == "group" else f"{self.bits} ({self.fmt})"

    def get(self, section: str, name: str) -> float | None:
        return self.metrics.get((section, name))

    def need(self, section: str, name: str) -> float:
        v = self.get(section, name)
        if v is None:
            raise NcuReportError(f"{self.path}: no '{name}' in section '{section}' (profile with the sections "
                                 f"run_gpu_profile.sh passes)")
        return v

    @property
    def tiles(self) -> int:
        """32-token (``block_n``) tiles of context the launch covers: requests x KV heads x ctx / block_n."""
        return self.grid[0] * self.grid[1] * math.ceil(self.ctx / self.block_n)

    @property
    def instructions(self) -> float:
        return self.need("Instruction Statistics", "Executed Instructions")

    def scaled(self, section: str, name: str, factors: dict[str, float]) -> float:
        """A metric in the unit ``factors`` maps to 1 (ncu picks the unit by magnitude: us / ms,
        Tbyte/s / Gbyte/s, Ghz / Mhz)."""
        v = self.need(section, name)
        unit = self.units.get((section, name), "")
        if unit not in factors:
            raise NcuReportError(f"{self.path}: '{name}' in unit {unit!r}, not one of {', '.join(factors)}")
        return v * factors[unit]

    @property
    def duration_us(self) -> float:
        return self.scaled("GPU Speed Of Light Throughput", "Duration",
                           {"us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "ns": 1e-3, "nsecond": 1e-3})

    @property
    def sms(self) -> int:
        return int(self.need("Launch Statistics", "# SMs"))

    @property
    def sm_ghz(self) -> float:
        return self.scaled("GPU Speed Of Light Throughput", "SM Frequency",
                           {"Ghz": 1.0, "GHz": 1.0, "Mhz": 1e-3, "MHz": 1e-3, "cycle/nsecond": 1.0})

    @property
    def issue_bound_us(self) -> float:
        """The executed instructions at one instruction per scheduler (4 per SM) per cycle."""
        return self.instructions / (4 * self.sms * self.sm_ghz * 1e3)

    @property
    def dram_tbps(self) -> float:
        return self.scaled("Memory Workload Analysis", "Memory Throughput",
                           {"Tbyte/s": 1.0, "Gbyte/s": 1e-3, "Mbyte/s": 1e-6})

    @property
    def dram_pct(self) -> float:
        return self.need("GPU Speed Of Light Throughput", "DRAM Throughput")

    @property
    def warp_cycles_per_issue(self) -> float:
        return self.need("Warp State Statistics", "Warp Cycles Per Issued Instruction")

    def stall_cycles(self) -> list[tuple[str, float, float]]:
        """``(reason, share of the samples, cycles per issued instruction)``, largest first."""
        total = sum(self.stalls.values())
        if not total:
            return []
        wc = self.warp_cycles_per_issue
        return sorted(((r, n / total, n / total * wc) for r, n in self.stalls.items() if n), key=lambda x: -x[1])


def _number(text: str) -> float | None:
    return None if text in ("n/a", "no data") else float(text.replace(",", ""))


def parse(text: str, path: str = "<report>") -> Profile:
    """One ncu text report (``--section ...`` tables, ``--metrics`` rows, rule texts) -> Profile.
    The report must hold the ``profiled ...`` line profile_decode.py prints and one stage-1 kernel."""
    head = kernel = None
    section = ""
    metrics: dict[tuple[str, str], float] = {}
    units: dict[tuple[str, str], str] = {}
    stalls: dict[str, float] = {}
    for line in text.splitlines():
        if head is None and (m := _PROFILED.match(line.strip())):
            head = m
            continue
        if kernel is None and (m := _KERNEL.match(line)):
            kernel = m
            continue
        if kernel is not None and _KERNEL.match(line):
            raise NcuReportError(f"{path}: more than one profiled launch (run_gpu_profile.sh profiles one: "
                                 f"--launch-count 1)")
        if m := _SECTION.match(line):
            section = m.group("name")
            continue
        m = _ROW.match(line)
        if m is None or m.group("name") in ("Metric Name",):
            continue
        name, value = m.group("name").strip(), _number(m.group("value"))
        if value is None:
            continue
        if name.startswith("smsp__pcsamp_warps_issue_stalled_"):
            reason = name.removeprefix("smsp__pcsamp_warps_issue_stalled_")
            if not reason.endswith("_not_issued"):
                stalls.setdefault(reason, value)  # --print-details repeats the rows: the first one counts
            continue
        metrics.setdefault((section, name), value)
        if m.group("unit"):
            units.setdefault((section, name), m.group("unit"))
    # ncu's rule texts wrap their lines: the uncoalesced-sectors rule is read from the joined text
    m = _EXCESS_SECTORS.search(re.sub(r"\s+", " ", text))
    excess = float(m.group("pct")) if m else None
    if head is None:
        raise NcuReportError(f"{path}: no 'profiled ...' line (a report of benches/kernels/profile_decode.py)")
    if kernel is None:
        raise NcuReportError(f"{path}: no profiled stage-1 kernel (_decode_stage1 / _gluon_decode_stage1): did ncu "
                             f"fail? (its report starts with ==PROF== / ==ERROR== lines)")
    rest = head.group("rest")
    gluon = re.search(r"gluon=(\S+)", rest)
    variant_m = re.search(r"variant=(\S+)", rest)
    variant = variant_m.group(1) if variant_m else ("gluon" if gluon and gluon.group(1) not in ("False", "None")
                                                    else "triton")
    return Profile(path=path, mode=head.group("mode") or "nowrite", bits=int(head.group("bits")),
                   batch=int(head.group("batch")), ctx=int(head.group("ctx")), block_n=int(head.group("bn")),
                   splits=int(head.group("splits")), kernel=kernel.group("name"), variant=variant,
                   grid=tuple(int(x) for x in kernel.group("grid").split(",")), metrics=metrics, units=units,
                   stalls=stalls, excessive_sectors_pct=excess, fmt=head.group("fmt") or "group")


def load(path: str | Path) -> Profile:
    return parse(Path(path).read_text(errors="replace"), str(path))


def _fmt(v: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def profile_rows(profiles: list[Profile]) -> list[str]:
    """The per-launch table (markdown lines)."""
    out = [
        "| B | ctx | bits | kernel (variant) | grid | ncu us | DRAM TB/s (% of peak) | L2 % | L1 % | issue slots busy % | "
        "eligible warps / scheduler | cycles between a warp's instructions | instructions / tile | at 1 IPC per "
        "scheduler us | shared wavefronts / tile | uncoalesced sectors % | registers, occupancy % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in sorted(profiles, key=lambda p: (p.bits, p.fmt, p.batch * p.ctx, p.batch)):
        shared = p.get("Command line profiler metrics", SHARED_WAVEFRONTS)
        regs = p.get("Launch Statistics", "Registers Per Thread")
        occ = p.get("Occupancy", "Achieved Occupancy")
        out.append(
            f"| {p.batch} | {p.ctx} | {p.label} | {p.kernel.strip('_')} ({p.variant}) | {'x'.join(map(str, p.grid))} | "
            f"{p.duration_us:.1f} | {p.dram_tbps:.2f} ({p.dram_pct:.0f} %) | "
            f"{_fmt(p.get('GPU Speed Of Light Throughput', 'L2 Cache Throughput'), '.0f')} | "
            f"{_fmt(p.get('GPU Speed Of Light Throughput', 'L1/TEX Cache Throughput'), '.0f')} | "
            f"{_fmt(p.get('Compute Workload Analysis', 'Issue Slots Busy'), '.1f')} | "
            f"{_fmt(p.get('Scheduler Statistics', 'Eligible Warps Per Scheduler'))} | {p.warp_cycles_per_issue:.2f} | "
            f"{p.instructions / p.tiles:.0f} | {p.issue_bound_us:.1f} | "
            f"{'not profiled' if shared is None else f'{shared / p.tiles:.1f}'} | {_fmt(p.excessive_sectors_pct, '.0f')} | "
            f"{_fmt(regs, '.0f')}, {_fmt(occ, '.1f')} |")
    return out


def stall_rows(profiles: list[Profile], top: int = 6) -> list[str]:
    """What a warp waits on, per launch: the largest PC-sampling reasons (cycles per issued
    instruction; their sum is the cycles between a warp's instructions)."""
    sampled = [p for p in profiles if p.stalls]
    if not sampled:
        return ["No stall samples in these reports (profile with `--metrics regex:smsp__pcsamp_warps_issue_stalled_.*`)."]
    out = ["| B | ctx | bits | " + " | ".join(f"wait {i + 1}" for i in range(top)) + " |",
           "|---|---|---|" + "---|" * top]
    for p in sorted(sampled, key=lambda p: (p.bits, p.fmt, p.batch * p.ctx, p.batch)):
        cells = [f"{STALL_WORDS.get(r, r)}: {c:.2f} ({s * 100:.0f} %)" for r, s, c in p.stall_cycles()[:top]]
        cells += ["-"] * (top - len(cells))
        out.append(f"| {p.batch} | {p.ctx} | {p.label} | " + " | ".join(cells) + " |")
    return out


def _shape_result(bench: dict, batch: int, ctx: int, bits: int) -> dict | None:
    for r in bench.get("summary", []):
        if r.get("batch") == batch and r.get("ctx") == ctx and r.get("bits") == bits:
            return r
    return None


def closing_rows(profiles: list[Profile], bench: dict) -> list[str]:
    """Per profiled shape with a speed target: the step time the target needs against the two
    floors of this run (the profiled stage 1's instructions at one per scheduler per cycle; the
    step's bytes at the run's copy bandwidth) and what each would have to become."""
    copy = bench.get("hbm_copy_TBps")
    out = ["| B | ctx | bits | step us | target | step us the target needs | issue floor us (stage 1) | bytes floor us "
           "(copy bandwidth) | instructions / tile at today's issue rate for the target | DRAM share of the copy "
           "bandwidth the target needs |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for p in sorted(profiles, key=lambda p: (p.bits, p.fmt, p.batch * p.ctx, p.batch)):
        r = _shape_result(bench, p.batch, p.ctx, p.bits)
        if r is not None and p.fmt == "page":  # the INT2 server default's format: its own step and bytes
            r = {**r, "oscar_us": r.get("served_us"), "oscar_TBps": r.get("served_TBps")}
        if r is None or not r.get("oscar_us"):
            continue
        # the shape's speed targets (issue 14) as the run's summary states them; the stricter one decides
        targets = [(r[t], r[base], name) for t, base, name in (("target_vs_sdpa", "sdpa_us", "SDPA"),
                                                               ("target_vs_sglang", "sglang_us", "SGLang"))
                   if r.get(t) and r.get(base)]
        if not targets:
            continue
        need_us = min(base / t for t, base, _ in targets)
        step_bytes = r["oscar_TBps"] * 1e12 * r["oscar_us"] * 1e-6 if r.get("oscar_TBps") else None
        bytes_floor = step_bytes / (copy * 1e12) * 1e6 if step_bytes and copy else None
        # today's instructions per tile, scaled by how much shorter the step has to be at the same issue rate
        ipt_needed = p.instructions / p.tiles * need_us / r["oscar_us"]
        dram_needed = step_bytes / (need_us * 1e-6) / (copy * 1e12) if step_bytes and copy else None
        told = "; ".join(f"{t:g}x {name} ({base:.1f} us)" for t, base, name in targets)
        out.append(f"| {p.batch} | {p.ctx} | {p.label} | {r['oscar_us']:.1f} | {told} | {need_us:.1f} | "
                   f"{p.issue_bound_us:.1f} | {_fmt(bytes_floor, '.1f')} | {ipt_needed:.0f} (today "
                   f"{p.instructions / p.tiles:.0f}) | {_fmt(None if dram_needed is None else dram_needed * 100, '.0f', ' %')} |")
    return out


def section(profiles: list[Profile], bench: dict | None) -> str:
    """The markdown section appended to kernels.md."""
    meta = (bench or {}).get("meta", {})
    lines = [
        "## Where the time goes (Nsight Compute)",
        "",
        f"Stage 1 of the launcher's default decode step (the write fused, as the backend runs it; "
        f"`profile_decode.py --config default --mode fused` under `ncu --clock-control none`), one launch per "
        f"shape, on the same GPU as the tables above{' (' + meta['gpu'] + ')' if meta.get('gpu') else ''}. "
        f"'instructions / tile': the launch's executed warp instructions per {profiles[0].block_n if profiles else 32}-token "
        f"tile of context (per (request, KV head)); 'at 1 IPC per scheduler': those instructions at one per "
        f"scheduler per cycle (4 per SM) at the profiled SM clock, the time the launch would take if no warp ever "
        f"waited. Reports: `ncu/` next to this file.",
        "",
        *profile_rows(profiles),
        "",
        "What a warp waits on, in cycles per issued instruction (PC sampling: each reason's share of the samples "
        "times the cycles between a warp's instructions; 'issuing' is the cycle it issues):",
        "",
        *stall_rows(profiles),
    ]
    if bench is not None:
        rows = closing_rows(profiles, bench)
        if len(rows) > 2:
            lines += [
                "",
                "What each speed target needs, against this run's two floors: the step time the target allows; the "
                "profiled instructions at one per scheduler per cycle; the step's bytes at the copy bandwidth "
                "measured above. A target below a floor cannot be met by the other lever alone; the instructions per "
                "tile that would meet it at today's issue rate, and the share of the copy bandwidth it would stream at:",
                "",
                *rows,
            ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", help="ncu text reports (run_gpu_profile.sh / regenerate.sh)")
    ap.add_argument("--bench", type=Path, help="the same run's kernels.json (for the targets' rows)")
    ap.add_argument("--append", type=Path, help="append the section to this markdown file (else print it)")
    args = ap.parse_args(argv)
    profiles, failed = [], []
    for r in args.reports:
        try:
            profiles.append(load(r))
        except NcuReportError as exc:
            failed.append(str(exc))
    for f in failed:
        print(f"ncu_report.py: skipped {f}", file=sys.stderr)
    if not profiles:
        print("ncu_report.py: no usable report", file=sys.stderr)
        return 2
    bench = json.loads(args.bench.read_text()) if args.bench else None
    text = section(profiles, bench)
    if args.append:
        with args.append.open("a") as f:
            f.write("\n" + text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
