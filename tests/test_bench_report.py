"""The kernel report's target table (benches/kernels/bench_decode.py, written by
benches/kernels/regenerate.sh into benches/results/kernels.md): a missed target reads "no", a met
one "yes", what was not measured "-", on the report's own summary of a run's results."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benches" / "kernels"))
bench_decode = pytest.importorskip("bench_decode")
#: the kernel report as the last GPU run left it (benches/kernels/regenerate.sh)
_STORED = Path(__file__).resolve().parents[1] / "benches" / "results"


def _oscar(us: float, nowrite: float) -> dict:
    cfg = {"block_n": 32, "num_warps": 1, "num_stages": 3, "num_splits": 32, "maxnreg": 128, "transposed": True,
           "gluon": "dnp_r128fs", "us": us, "TBps": 1.0, "default": True}
    return {"best": cfg, "variants": [cfg], "nowrite_us": nowrite, "unfused_us": us + 5, "stage2_us": 3.0,
            "stream_only": {"us": us / 2, "TBps": 3.0}}


def _run(sdpa_us: float, authors_g128: dict, extend_ratio: float) -> dict:
    """One shape, (8, 32768): INT2 100 us, INT4 120 us, the write 1 us of each."""
    shape = {"batch": 8, "ctx": 32768, "int2": _oscar(100.0, 99.0), "int4": _oscar(120.0, 119.0),
             "sdpa": {"us": sdpa_us}, "sglang": {"us": 300.0},
             "authors_g32": {"us": 400.0}, "authors_g128": authors_g128}
    ext = {"batch": 1, "prefix": 32768, "new": 1024, "bits": 2, "oscar": {"us": 10.0, "block_m": 0},
           "oscar_default_us": 10.0, "sglang": {"us": 10.0 * extend_ratio}, "vs_sglang_default": extend_ratio}
    meta = {"gpu": "test", "torch": "-", "triton": "-", "cuda": "-", "python": "-", "commit": "abc", "date": "-",
            "variants": "default", "command": "python3 benches/kernels/bench_decode.py --quick"}
    return {"meta": meta, "shapes": [shape], "write": {}, "seal": {"2": {"TBps": 1.0, "us_per_page": 0.6}},
            "hbm_copy_TBps": 4.2, "extend": [ext]}


def _table(res: dict) -> dict[str, dict]:
    rows = bench_decode.summarize(res)
    return {t["measure"]: t for t in bench_decode.targets_table(res, rows)}


def test_missed_and_met_targets_are_told_apart():
    # INT2 2.5x SDPA (target 4x): missed; INT4 2.08x (target 2.5x): missed; 3x SGLang (target 5x):
    # missed; the authors' kernel 4x / 2.5x slower: met; extend 1.2x: met; write 1 %: met
    t = _table(_run(250.0, {"us": 250.0}, 1.2))
    assert t["INT2 decode vs SDPA BF16 at (8, 32768)"]["met"] is False
    assert t["INT2 decode vs SDPA BF16 at (8, 32768)"]["measured"] == "2.50x"
    assert t["INT2 decode vs SDPA BF16 at (16, 65536)"]["met"] is None  # not measured in this run
    assert t["INT2 decode vs SDPA BF16 at (16, 65536)"]["measured"] == "not measured"
    assert t["INT4 decode vs SDPA BF16 (every shape)"]["met"] is False
    assert t["INT2 decode vs SGLang Triton BF16 (every shape)"]["met"] is False
    assert t["INT2 decode vs the authors' CUDA kernel, their group 32 (every shape)"]["met"] is True
    assert t["INT2 decode vs the authors' CUDA kernel, their group 128 (every shape)"]["met"] is True
    assert t["extend (the server's launch) vs SGLang BF16 extend (every shape, INT2 and INT4)"]["met"] is True
    assert t["write path share of a decode step (every shape)"]["met"] is True


def test_the_writes_own_work_is_told_apart_from_the_launch_without_the_write():
    """'write us': the launch over the same launch compiled without the write; 'write work us': over
    the same launch with the write compiled in but storing nothing (skipwrite). The target row keeps
    the first."""
    res = _run(250.0, {"us": 250.0}, 1.2)
    res["shapes"][0]["int2"].update(nowrite_us=94.0, skipwrite_us=99.5)  # 100 us: 6 us "write", 0.5 us its work
    rows = bench_decode.summarize(res)
    r2 = next(r for r in rows if r["bits"] == 2)
    assert r2["write_us"] == pytest.approx(6.0) and r2["write_work_us"] == pytest.approx(0.5)
    assert next(r for r in rows if r["bits"] == 4)["write_work_us"] is None  # not measured: no column value
    t = {t["measure"]: t for t in bench_decode.targets_table(res, rows)}
    assert t["write path share of a decode step (every shape)"]["met"] is False
    md = bench_decode.markdown(res, rows)
    assert "| write us | write share | write work us |" in md
    assert "| 6.00 | 6.0% | 0.50 |" in md and "| 1.00 | 0.8% | nan |" in md


def test_a_met_speed_target_and_a_slower_extend_and_peer():
    # SDPA 450 us: INT2 4.5x (met) and INT4 3.75x (met); the authors' group 128 faster than ours
    # (90 us): missed; extend 0.9x: missed
    t = _table(_run(450.0, {"us": 90.0}, 0.9))
    assert t["INT2 decode vs SDPA BF16 at (8, 32768)"]["met"] is True
    assert t["INT4 decode vs SDPA BF16 (every shape)"]["met"] is True
    assert t["INT2 decode vs the authors' CUDA kernel, their group 128 (every shape)"]["met"] is False
    assert t["extend (the server's launch) vs SGLang BF16 extend (every shape, INT2 and INT4)"]["met"] is False


def test_a_failing_peer_decides_nothing_and_the_report_renders():
    res = _run(250.0, {"group": 128, "error": "an illegal memory access"}, 1.2)
    t = _table(res)
    peer = t["INT2 decode vs the authors' CUDA kernel, their group 128 (every shape)"]
    assert peer["met"] is None  # no shape measured: neither met nor missed
    assert peer["measured"] == "not measured; their kernel failed at 1 of 1 shapes"
    md = bench_decode.markdown(res, bench_decode.summarize(res))
    assert "## Targets (issue 14), this run" in md
    assert "| INT2 decode vs SDPA BF16 at (8, 32768) | 2.50x | >= 4x | no |" in md
    assert "gluon:dnp_r128fs" in md  # the config column names the Gluon stage 1 where it ran
    assert "failed" in md  # the peer table gives their failure
    assert "kernels_history.md" in md


def test_the_servers_int2_format_gets_its_own_target_rows_and_table():
    # the paper-format INT2 row at 100 us; the server's default format (page-grid key ranges) 80 us:
    # 250 / 80 = 3.125x SDPA, its own row against the same 4x target, and a table naming the format
    res = _run(250.0, {"us": 250.0}, 1.2)
    res["shapes"][0]["int2_served"] = {"us": 80.0, "effective_bits": 2.96, "stage1": "gluon:dnp_r128fslwn"}
    t = _table(res)
    row = t["INT2 decode in the server's default format vs SDPA BF16 at (8, 32768)"]
    assert row["measured"] == "3.12x" and row["met"] is False
    assert t["INT2 decode in the server's default format vs SDPA BF16 at (16, 65536)"]["met"] is None
    md = bench_decode.markdown(res, bench_decode.summarize(res))
    assert "## INT2 in the server's default format" in md
    assert "| 8 | 32768 | 80.0 | 2.960 | gluon:dnp_r128fslwn | 3.12 | 100.0 | 0.80 |" in md
    assert bench_decode.SERVED_INT2_FORMAT[1:] == (16, 64, True)  # config.INT2_FORMAT, as the server stores it
    # a failed measurement is told, not dropped, and decides no target
    res["shapes"][0]["int2_served"] = {"error": "RuntimeError: out of memory"}
    t = _table(res)
    assert t["INT2 decode in the server's default format vs SDPA BF16 at (8, 32768)"]["met"] is None
    assert "| 8 | 32768 | failed |" in bench_decode.markdown(res, bench_decode.summarize(res))


def test_each_speed_target_is_set_against_the_loads_alone():
    # INT2 100 us, its stream-only kernel 50 us: 5x SGLang (300 us) allows 60 us = 1.2x the bare loads,
    # 4x SDPA (250 us) 62.5 us = 1.25x; INT4 120 us against 2.5x SDPA: 100 us = 1.67x its 60 us
    res = _run(250.0, {"us": 250.0}, 1.2)
    rows = bench_decode.summarize(res)
    fl = bench_decode.floors_table(res, rows)
    assert [(x["bits"], x["target"]) for x in fl] == [(2, "5x SGLang"), (2, "4x SDPA"), (4, "2.5x SDPA")]
    assert [x["allowed_us"] for x in fl] == pytest.approx([60.0, 62.5, 100.0])
    assert [x["allowed_over_stream"] for x in fl] == pytest.approx([1.2, 1.25, 100 / 60])
    assert [x["met"] for x in fl] == [False, False, False]
    assert fl[0]["step_over_stream"] == pytest.approx(2.0) and fl[0]["merge_launch_us"] == 3.0
    # the step's bytes (1 TB/s x 100 us = 100 MB) at the run's copy bandwidth (4.2 TB/s)
    assert fl[0]["copy_floor_us"] == pytest.approx(100 / 4.2)
    md = bench_decode.markdown(res, rows)
    assert "## What each speed target leaves for the math" in md
    assert "| 8 | 32768 | 2 | 100.0 | 5x SGLang | 60.0 | no | 50.0 | 1.20 | 2.00 | 3.0 | 23.8 |" in md
    assert "The 3 missed rows allow 1.20x - 1.67x the stream-only time (today's steps take 2.00x - 2.00x it). " \
           "0 of them allow less than 1.2x" in md
    # a met target reads "yes"; a run without the stream-only kernel gives "-" instead of a ratio
    res = _run(500.0, {"us": 250.0}, 1.2)
    del res["shapes"][0]["int4"]["stream_only"]
    fl = {(x["bits"], x["target"]): x for x in bench_decode.floors_table(res, bench_decode.summarize(res))}
    assert fl[2, "4x SDPA"]["met"] is True and fl[4, "2.5x SDPA"]["allowed_over_stream"] is None
    assert "| 8 | 32768 | 4 | 120.0 | 2.5x SDPA | 200.0 | yes | - | - | - |" in bench_decode.markdown(
        res, bench_decode.summarize(res))


def test_the_stored_report_renders_again_from_its_json(tmp_path):
    """``--report-from``: kernels.md again from the stored kernels.json, no GPU: the same target table
    and the same "Where the time goes" section (from the ncu/ reports next to the JSON), the header
    naming the rendering."""
    stored = (_STORED / "kernels.md").read_text()
    path = bench_decode.render_again(str(_STORED / "kernels.json"), str(tmp_path), "python3 x --report-from y")
    text = Path(path).read_text()
    assert "by `python3 x --report-from y` (no GPU): the same measurements in today's report." in text

    def section(md: str, title: str) -> str:
        return md.split(title, 1)[1].split("\n## ", 1)[0]

    assert section(text, "## Targets (issue 14), this run") == section(stored, "## Targets (issue 14), this run")
    assert section(text, "## Decode\n") == section(stored, "## Decode\n")
    assert text.split("## Where the time goes", 1)[1] == stored.split("## Where the time goes", 1)[1]
    assert "## What each speed target leaves for the math" in text


def test_report_from_runs_as_the_readme_types_it_without_a_gpu(tmp_path):
    """The README's command, on this machine (no GPU): the CLI reaches the rendering before any device
    call."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "benches/kernels/bench_decode.py", "--report-from",
                           "benches/results/kernels.json", "--out", str(tmp_path)], cwd=root, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    text = (tmp_path / "kernels.md").read_text()
    assert "--report-from benches/results/kernels.json" in text and "## Where the time goes" in text
    # a file that is not a kernels.json: one line saying so, exit status 1, nothing written
    bad = tmp_path / "extend.json"
    bad.write_text('{"rows": []}')
    done = subprocess.run([sys.executable, "benches/kernels/bench_decode.py", "--report-from", str(bad), "--out",
                           str(tmp_path / "bad")], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == f"bench_decode.py --report-from: {bad}: not a kernels.json of bench_decode.py (no meta / shapes)"
    assert not (tmp_path / "bad" / "kernels.md").exists()


def test_rendering_again_refuses_what_is_not_a_kernels_json(tmp_path):
    bad = tmp_path / "seal.json"
    bad.write_text('{"meta": {}, "rows": []}')
    with pytest.raises(ValueError, match="not a kernels.json of bench_decode.py"):
        bench_decode.render_again(str(bad), str(tmp_path), "x")
    assert not (tmp_path / "kernels.md").exists()


# ---- "Where the time goes" (benches/kernels/ncu_report.py) on Nsight Compute reports kept from GPU runs

ncu_report = pytest.importorskip("ncu_report")
_RESULTS = Path(__file__).resolve().parents[1] / "benches" / "results"
#: H200, session 22: stage 1 of the Gluon default at (8, 32768) INT2 with its PC-sampling stall reasons
_H200_STALLS = _RESULTS / "kernels_gluon_s22" / "ncu_8x32768_gluon-dnp_r128fs.txt"
#: H100, session 27: the fused step's stage 1 at (16, 65536) INT2, sections only (no stall samples)
_H100_FUSED = _RESULTS / "kernels_gluon_s27" / "ncu_16x65536_gluon-dnp_r128fslwk_fused.txt"


def test_ncu_report_reads_the_launch_its_limits_and_its_stalls():
    p = ncu_report.load(_H200_STALLS)
    assert (p.mode, p.bits, p.batch, p.ctx, p.block_n, p.splits) == ("nowrite", 2, 8, 32768, 32, 32)
    assert p.kernel == "_gluon_decode_stage1_kernel" and p.grid == (8, 8, 33)
    assert (p.duration_us, p.dram_pct, p.dram_tbps, p.sms, p.sm_ghz) == (111.04, 39.1, 1.88, 132, 1.74)
    assert p.instructions == 55_751_104 and p.tiles == 8 * 8 * 1024
    assert p.issue_bound_us == pytest.approx(55_751_104 / (4 * 132 * 1.74e3))
    assert p.excessive_sectors_pct == 28  # a rule text ncu wraps over two lines
    # the stall rows are printed twice with --print-details all: the first one counts, *_not_issued never
    assert p.stalls["long_scoreboard"] == 3807 and "long_scoreboard_not_issued" not in p.stalls
    cycles = p.stall_cycles()
    assert cycles[0][0] == "long_scoreboard"
    assert sum(c for _, _, c in cycles) == pytest.approx(p.warp_cycles_per_issue)  # the shares split the 5.82 cycles
    assert cycles[0][2] == pytest.approx(3807 / sum(p.stalls.values()) * 5.82)


def test_ncu_report_section_tells_what_each_target_needs():
    bench = {"meta": {"gpu": "NVIDIA H200"}, "hbm_copy_TBps": 4.0, "summary": [
        {"batch": 8, "ctx": 32768, "bits": 2, "oscar_us": 120.0, "oscar_TBps": 2.0, "sdpa_us": 240.0, "sglang_us": 280.0,
         "target_vs_sdpa": 4.0, "target_vs_sglang": 5.0},
        {"batch": 16, "ctx": 65536, "bits": 2, "oscar_us": 400.0, "oscar_TBps": 2.0, "sdpa_us": 900.0, "sglang_us": None,
         "target_vs_sdpa": 4.0, "target_vs_sglang": 5.0}]}
    profiles = [ncu_report.load(_H200_STALLS), ncu_report.load(_H100_FUSED)]
    rows = {tuple(r.split(" | ")[:3]): r.split(" | ") for r in ncu_report.closing_rows(profiles, bench)[2:]}
    r8 = rows[("| 8", "32768", "2")]
    # 4x SDPA needs 60 us, 5x SGLang 56 us: the stricter decides; the step's 240 MB at 4 TB/s take 60 us
    assert r8[5] == "56.0" and r8[6] == f"{profiles[0].issue_bound_us:.1f}" and r8[7] == "60.0"
    assert r8[8] == f"{profiles[0].instructions / profiles[0].tiles * 56 / 120:.0f} (today {profiles[0].instructions / profiles[0].tiles:.0f})"
    assert r8[9].startswith("107 %")  # 240 MB in 56 us: more than the copy bandwidth
    r16 = rows[("| 16", "65536", "2")]
    assert r16[5] == "225.0" and "SGLang" not in r16[4]  # no SGLang time in this run: SDPA's target alone
    text = ncu_report.section(profiles, bench)
    assert "## Where the time goes (Nsight Compute)" in text and "NVIDIA H200" in text
    assert "global/local memory (long scoreboard): 1.84 (32 %)" in text
    assert "| 16 | 65536 | 2 | gluon_decode_stage1_kernel (gluon) | 16x8x17 | 349.5 | 2.35 (70 %) |" in text


def test_ncu_report_refuses_what_is_not_a_stage_1_profile(tmp_path, capsys):
    bad = tmp_path / "ncu_8x32768_default_int2.txt"
    bad.write_text("==PROF== Connected to process 1\n==ERROR== An error was reported by the driver\n")
    with pytest.raises(ncu_report.NcuReportError, match="no 'profiled ...' line"):
        ncu_report.load(bad)
    head = _H100_FUSED.read_text().split("  _gluon_decode_stage1_kernel")[0]
    (tmp_path / "nokernel.txt").write_text(head)
    with pytest.raises(ncu_report.NcuReportError, match="no profiled stage-1 kernel"):
        ncu_report.load(tmp_path / "nokernel.txt")
    assert ncu_report.main([str(bad)]) == 2
    out = tmp_path / "kernels.md"
    out.write_text("# report\n")
    assert ncu_report.main([str(bad), str(_H100_FUSED), "--append", str(out)]) == 0
    assert "skipped" in capsys.readouterr().err
    assert out.read_text().startswith("# report\n\n## Where the time goes")


def test_ncu_report_tells_the_servers_int2_format_apart(tmp_path):
    # profile_decode.py --format page names the format in its line; such a report is the INT2 server
    # default's launch: labelled "2 (page)" and held to the summary's server-format step (served_us)
    text = _H200_STALLS.read_text()
    line = next(x for x in text.splitlines() if x.startswith("profiled"))
    page = tmp_path / "ncu_8x32768_default_int2_page.txt"
    page.write_text(text.replace(line, line.replace("INT2 B=", "INT2 format=page B=", 1)))
    p, g = ncu_report.load(page), ncu_report.load(_H200_STALLS)
    assert (p.fmt, p.label, g.fmt, g.label) == ("page", "2 (page)", "group", "2")
    bench = {"meta": {}, "hbm_copy_TBps": 4.0, "summary": [
        {"batch": 8, "ctx": 32768, "bits": 2, "oscar_us": 100.0, "oscar_TBps": 2.0, "served_us": 120.0, "served_TBps": 1.6,
         "sdpa_us": 240.0, "sglang_us": None, "target_vs_sdpa": 4.0, "target_vs_sglang": 5.0}]}
    rows = [r.split(" | ") for r in ncu_report.closing_rows([g, p], bench)[2:]]
    assert [(r[2], r[3]) for r in rows] == [("2", "100.0"), ("2 (page)", "120.0")]
    assert "| 8 | 32768 | 2 (page) | gluon_decode_stage1_kernel" in ncu_report.section([g, p], bench)
    # the line profile_decode.py prints with --format (its f-string, as written there)
    src = (Path(__file__).resolve().parents[1] / "benches" / "kernels" / "profile_decode.py").read_text()
    assert 'INT{args.bits} format={args.format} B={batch} ctx={ctx} bn={tune.block_n}' in src


def test_regenerate_asks_ncu_for_what_the_report_reads():
    script = (Path(__file__).resolve().parents[1] / "benches" / "kernels" / "regenerate.sh").read_text()
    assert f'metrics="{ncu_report.NCU_METRICS}"' in script
    assert "ncu_report.py --bench" in script
    assert "run_gpu_profile.sh \"${spec#*:}\" default" in script  # profile_decode.py --config default
    assert "2p:8x32768" in script and "--format $fmt" in script  # the server's INT2 format profiled too


# ---- sensitivity experiments (benches/kernels/sensitivity.py): patched copies of the Gluon kernel

sensitivity = pytest.importorskip("sensitivity")
_PACKAGE = Path(__file__).resolve().parents[1] / "python" / "oscar_sgl"


@pytest.mark.parametrize("patches", [["pairs"], ["vparams"], ["hadd2"], ["vfold"], ["pairs", "vparams"], ["pairs", "vfold"]])
def test_sensitivity_patches_apply_to_todays_kernel(tmp_path, patches):
    import ast

    pkg = sensitivity.patched_copy(patches, tmp_path, source=_PACKAGE)
    text = (pkg / "kernels" / "gluon_decode.py").read_text()
    ast.parse(text)  # still Python
    original = (_PACKAGE / "kernels" / "gluon_decode.py").read_text()
    for name in patches:
        for old, new in sensitivity.PATCHES[name]:
            assert old in original and (old not in text or old in new)  # vfold keeps _attend's header
    assert ("SENSITIVITY" in text) == (patches != ["hadd2"])
    assert not (pkg / "kernels" / "gluon_decode.py").is_symlink()  # a copy: the repository is not touched
    assert (_PACKAGE / "kernels" / "gluon_decode.py").read_text() == original


def test_sensitivity_refuses_a_patch_whose_source_is_gone(tmp_path):
    src = tmp_path / "src" / "oscar_sgl"
    (src / "kernels").mkdir(parents=True)
    (src / "kernels" / "gluon_decode.py").write_text("# a kernel without the permutes\n")
    with pytest.raises(ValueError, match="patch .pairs.: its source text is not in gluon_decode.py"):
        sensitivity.patched_copy(["pairs"], tmp_path / "a", source=src)
    with pytest.raises(ValueError, match="unknown patch 'prmt'"):
        sensitivity.patched_copy(["prmt"], tmp_path / "b", source=src)


def test_sensitivity_report_sets_each_patch_against_none():
    def run(scale: float) -> dict:
        row = {"batch": 8, "ctx": 32768, "bits": 2, "default": {"us": 120.0 * scale},
               "gluon:dnp_r128fslwk": {"us": 100.0 * scale}, "agree_rel_rms_by_variant": {"dnp_r128fslwk": 1.0}}
        return {"rows": sensitivity._rows({"meta": {}, "rows": [row]})}

    md = sensitivity.report({"none": run(1.0), "pairs": run(0.95)})
    assert "| 8 | 32768 | 2 | gluon:dnp_r128fslwk | 100.0 | 95.0 (5.0 %) |" in md
    assert "| 8 | 32768 | 2 | default | 120.0 | 114.0 (5.0 %) |" in md


def test_ncu_report_reads_units_by_their_names(tmp_path):
    text = _H100_FUSED.read_text()
    small = (text.replace("Memory Throughput                          Tbyte/s         2.35",
                          "Memory Throughput                          Gbyte/s       812.50")
             .replace("Duration                         us       349.54", "Duration                         ms         1.25"))
    (tmp_path / "r.txt").write_text(small)
    p = ncu_report.load(tmp_path / "r.txt")
    assert p.dram_tbps == pytest.approx(0.8125) and p.duration_us == pytest.approx(1250.0)
    (tmp_path / "bad.txt").write_text(text.replace("Ghz         1.85", "furlong         1.85"))
    with pytest.raises(ncu_report.NcuReportError, match="'SM Frequency' in unit 'furlong'"):
        ncu_report.load(tmp_path / "bad.txt").sm_ghz


def test_page_rule_column_patches_the_launchers_page_rule_and_restores_it(monkeypatch):
    """``--gluon-page-rule``: the candidate column's tuning is the launcher's own with the page-grid
    rule taking the Gluon stage 1 at INT2 (the variant on the asked tile), and nothing stays patched.
    Tried from session 25's rule (INT4 only, 16-token tiles), the one session 29's column replaced."""
    dec = bench_decode._dec
    monkeypatch.setattr(dec, "GLUON_DEFAULT_PAGE_BITS", (4,))
    monkeypatch.setattr(dec, "GLUON_DEFAULT_PAGE_VARIANT", "dnp_r128fslw")
    monkeypatch.setattr(dec, "GLUON_DEFAULT_PAGE_BLOCK_N", 16)
    before = (dec.GLUON_DEFAULT_PAGE_BITS, dec.GLUON_DEFAULT_PAGE_VARIANT, dec.gluon_block_n)
    kw = dict(batch=8, num_kv_heads=8, group=4, head_dim=128, bits=2, k_group=16, v_group=64, key_page=True,
              device=__import__("torch").device("cpu"), capability=(9, 0))
    assert "page-grid key ranges" in dec.gluon_default_reason(block_n=16, **kw)
    assert dec.gluon_block_n(32, 16, True) == 16
    with bench_decode._page_rule("dnp_r128fslwn", 32):
        assert dec.gluon_block_n(32, 16, True) == 32 and dec.gluon_block_n(32, 32, True) == 32
        reason = dec.gluon_default_reason(block_n=32, **kw)
        # past the page rule: only what this machine lacks (a Triton 3.6 Gluon) may still say no
        assert reason is None or reason.startswith(("the Gluon stage 1 is written against", "triton.experimental")), reason
    with bench_decode._page_rule("dnp_r128fslwnk", 32):  # folded keys take one key group per tile
        assert "one key group per tile" in dec.gluon_default_reason(block_n=32, **kw)
    with bench_decode._page_rule("dnp_r128fslwn", 16):
        assert dec.gluon_block_n(32, 16, True) == 16
    assert (dec.GLUON_DEFAULT_PAGE_BITS, dec.GLUON_DEFAULT_PAGE_VARIANT, dec.gluon_block_n) == before
    assert dec.gluon_block_n(32, 16, True) == 16


# ---- per-instruction stalls (benches/kernels/ncu_source_stalls.py) on a source page kept from a GPU run
ncu_source_stalls = pytest.importorskip("ncu_source_stalls")
_SRC_8x32768 = Path(__file__).resolve().parents[1] / "benches" / "results" / "kernels_gluon_s34" / "profile_h100" / "src_8x32768.csv.xz"


def test_source_stalls_find_the_sealed_loop_and_its_load_waits():
    """Session 34's H100 source page of the default step's stage 1 at (8, 32768) INT2: the hottest
    loop is the 692-instruction sealed-tile loop (88 % of the samples), whose largest stall is the
    wait on global loads, charged at the first readers of the tile's key params and, ~360
    instructions later, of its value params (the loads ptxas issued after the keys' wait)."""
    import lzma

    s = ncu_source_stalls.summarize(ncu_source_stalls.rows_of(lzma.decompress(_SRC_8x32768.read_bytes()).decode()), 30)
    assert s["loop_instructions"] == 692 and 0.85 < s["loop_samples"] / s["samples"] < 0.9
    (first, n_first), = s["reasons"].most_common(1)
    assert first == "stall_long_sb" and 0.35 < n_first / s["loop_samples"] < 0.4
    top = {i: (src, n, why) for i, src, n, why in s["top"]}
    assert top[79][0].startswith("PRMT") and top[79][2][0][0] == "long_sb"
    assert top[443][0].startswith("IMAD") and top[443][2][0][0] == "long_sb" and top[443][1] > 800
    assert s["by_opcode"].most_common(1)[0][0] == "PRMT"


def test_source_stalls_refuse_what_is_not_a_source_page():
    with pytest.raises(ValueError, match="not an ncu source page"):
        ncu_source_stalls.rows_of('"ID","Metric"\n"1","x"\n')
    header = '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_wait"\n'
    with pytest.raises(ValueError, match="no loop"):
        ncu_source_stalls.summarize(ncu_source_stalls.rows_of(header + '"0x10","FADD R1, R2, R3","4","32","4"\n'))
    rows = ncu_source_stalls.rows_of(header + '"0x10","FADD R1, R2, R3","4","32","4"\n"0x20","@P0 BRA 0x10","1","32","1"\n')
    assert ncu_source_stalls.summarize(rows)["loop_instructions"] == 2


# ---- two tunings or two kernel sources side by side (benches/kernels/tuning_ab.py)
tuning_ab = pytest.importorskip("tuning_ab")


def test_tuning_ab_takes_the_launchers_variant_with_a_suffix_and_another_gluon_source(tmp_path):
    """``gluon_variant=+h`` / ``-h``: the shape's own variant with the lane form's suffix added or
    taken off (not doubled, nothing to take off left alone); other fields pass through. ``--a-gluon
    FILE``: the launcher runs the Gluon stage 1 of another ``gluon_decode.py`` inside the block only,
    and the installed one after it (also after an error)."""
    import dataclasses
    import types

    from oscar_sgl.kernels import decode

    plain = types.SimpleNamespace(gluon_variant="dnp_r128fslwnkxv")
    lanes = types.SimpleNamespace(gluon_variant="dnp_r128fslwnkxvh")
    assert tuning_ab.variant_suffix({"gluon_variant": "+h"}, plain) == {"gluon_variant": "dnp_r128fslwnkxvh"}
    assert tuning_ab.variant_suffix({"gluon_variant": "+h"}, lanes) == {"gluon_variant": "dnp_r128fslwnkxvh"}
    assert tuning_ab.variant_suffix({"gluon_variant": "-h", "merge_pdl": True}, lanes) == \
        {"gluon_variant": "dnp_r128fslwnkxv", "merge_pdl": True}
    assert tuning_ab.variant_suffix({"gluon_variant": "-h"}, plain) == {"gluon_variant": "dnp_r128fslwnkxv"}
    assert tuning_ab.variant_suffix({"gluon_variant": "regs1"}, plain) == {"gluon_variant": "regs1"}
    fields = {f.name: f for f in dataclasses.fields(decode._DecodeTuning)}
    assert tuning_ab.parse_fields("gluon_variant=+h", fields) == {"gluon_variant": "+h"}
    src = Path(decode.gluon_decode.__file__).read_text().replace("LAZY_TAU = 8.0", "LAZY_TAU = 7.0")
    (tmp_path / "gluon_decode_prev.py").write_text(src)
    mod = tuning_ab.load_gluon_source(tmp_path / "gluon_decode_prev.py")
    installed = decode.gluon_decode
    assert mod is not installed and mod.LAZY_TAU == 7.0 and installed.LAZY_TAU == 8.0
    with tuning_ab.gluon_source(decode, mod):
        assert decode.gluon_decode is mod
    assert decode.gluon_decode is installed
    with pytest.raises(RuntimeError), tuning_ab.gluon_source(decode, mod):
        raise RuntimeError
    assert decode.gluon_decode is installed
    with tuning_ab.gluon_source(decode, None):
        assert decode.gluon_decode is installed


def test_graph_node_cost_refuses_a_machine_without_a_gpu_and_reports_every_row(tmp_path, capsys):
    """benches/kernels/graph_node_cost.py: without CUDA one line and exit 3 (nothing timed); with it,
    a tiny run writes the base row, one row per empty launch and (where torch has conditional nodes)
    the IF rows, each with its repeats."""
    import torch

    import graph_node_cost

    out = tmp_path / "cost.json"
    rc = graph_node_cost.main(["--steps", "2", "--replays", "2", "--repeats", "1", "--programs", "8", "16",
                               "--out", str(out)])
    if not torch.cuda.is_available():
        assert rc == 3 and "needs a CUDA GPU" in capsys.readouterr().err and not out.exists()
        return
    import json

    rows = {r["row"]: r for r in json.loads(out.read_text())["rows"]}
    assert rc == 0 and {"base", "empty 8", "empty 16"} <= set(rows)
    assert all(len(r["repeats"]) == 1 and r["us"] > 0 for r in rows.values())
    if hasattr(torch.cuda.CUDAGraph, "begin_capture_to_if_node"):
        assert "if-false 16" in rows and "if-true 16" in rows
