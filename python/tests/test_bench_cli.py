"""`headlight bench attention` on a decode shape: the key/value rate against both references it
measures in the same run (the probe's own buffer, and the same streaming read over the very K and
V copies the runs read), each fraction the rate over its reference; the threads' hand-off latency."""

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "build" / "release" / "apps" / "cli" / "headlight"


@pytest.mark.parametrize("layout", ["rows", "blocked"])
def test_decode_reports_its_rate_against_the_probe_and_its_own_copies(layout):
    r = subprocess.run(
        [str(CLI), "bench", "attention", "--seq", "1", "--seq-kv", "256", "--heads", "4",
         "--kv-heads", "2", "--head-dim", "64", "--dtype", "bf16", "--kv-layout", layout,
         "--runs", "3", "--warmup", "0", "--json"],
        capture_output=True, text=True, timeout=120, check=True)
    d = json.loads(r.stdout)
    kv_bytes = 2 * 2 * 256 * 2 * 64  # bf16: batch 1, 2 kv heads, 256 keys, K and V of 64
    assert d["kv_bytes"] == kv_bytes
    assert d["kv_copies"] > 1  # rotated, so that each run reads from memory
    assert d["kv_gbytes_per_second"] == pytest.approx(kv_bytes / d["seconds_median"] * 1e-9)
    for reference, fraction in [("bandwidth_gbytes_per_second", "fraction_of_bandwidth"),
                                ("kv_read_gbytes_per_second", "fraction_of_kv_read")]:
        assert d[reference] > 0.1, (reference, d[reference])  # GB/s: a real read, not 0
        assert d[fraction] == pytest.approx(d["kv_gbytes_per_second"] / d[reference])
    # Where the two threads were: the hand-off latency after each run, median within its range.
    assert 0 < d["handoff_ns_min"] <= d["handoff_ns"] <= d["handoff_ns_max"]


def test_one_thread_reports_no_handoff():
    r = subprocess.run(
        [str(CLI), "bench", "attention", "--seq", "1", "--seq-kv", "256", "--heads", "4",
         "--kv-heads", "2", "--head-dim", "64", "--threads", "1", "--runs", "2", "--warmup", "0",
         "--json"],
        capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(r.stdout)["handoff_ns"] == 0


def test_a_forward_shape_reports_no_read_rates():
    r = subprocess.run(
        [str(CLI), "bench", "attention", "--seq", "64", "--heads", "2", "--head-dim", "32",
         "--runs", "1", "--warmup", "0", "--json"],
        capture_output=True, text=True, timeout=120, check=True)
    d = json.loads(r.stdout)
    assert "kv_read_gbytes_per_second" not in d and "fraction_of_kv_read" not in d


def _cpu_has_amx():
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "amx_bf16" in flags and "amx_tile" in flags


def test_amx_costs_are_measured_where_the_cpu_has_amx():
    r = subprocess.run([str(CLI), "bench", "amx", "--repeats", "1", "--json"],
                       capture_output=True, text=True, timeout=120, check=True)
    d = json.loads(r.stdout)
    costs = {k: v for k, v in d.items() if k.endswith("_ns")}
    assert len(costs) == 18
    if not d["available"]:
        assert not _cpu_has_amx()
        assert all(v == 0 for v in costs.values())
        return
    assert _cpu_has_amx()
    assert all(0 < v < 10_000 for v in costs.values()), costs  # ns per operation
    # A 2 x 2 block's product cannot beat the product loop it is made of, by more than noise.
    assert d["block_ns"] > 0.5 * d["product_ns"]
    # Work beside other work takes at least as long as the larger part alone, within noise.
    assert d["fmas_products_ns"] > 0.5 * max(d["fmas_ns"], 4 * d["product_ns"])
    assert d["fmas_loads_l1_ns"] > 0.5 * max(d["fmas_ns"], 4 * d["load_l1_ns"])
    text = subprocess.run([str(CLI), "bench", "amx", "--repeats", "1"], capture_output=True,
                          text=True, timeout=120, check=True).stdout
    assert "tile store into L2" in text


def test_inputs_larger_than_any_memory_are_refused_naming_the_tensor():
    # 2^40 rows: 1,024 TiB of queries, past any machine's address space.
    r = subprocess.run([str(CLI), "bench", "attention", "--seq", str(1 << 40), "--dtype", "bf16",
                        "--runs", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("headlight: error: out of memory: Tensor [1, 8, 1099511627776, 64] "
                                "bfloat16: cannot allocate 1024.0 TiB"), r.stderr


def test_amx_costs_refuse_a_bad_repeat_count_by_name():
    r = subprocess.run([str(CLI), "bench", "amx", "--repeats", "0"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    assert "--repeats" in r.stderr


def test_matmul_compare_times_both_libraries_against_the_peak():
    """bench/matmul_compare.py: one row per library per shape, its FLOP/s from 2·M·N·K over the
    median time, its fraction over the peak printed above the table."""
    import sys
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "matmul_compare.py"), "--shapes",
                        "64x48x32,96x64x128", "--rounds", "1", "--runs", "2"], capture_output=True,
                       text=True, timeout=300, check=True)
    peak = float(r.stdout.split("peak measured in this run: ")[1].split(" GFLOP/s")[0])
    rows = [line.split("|")[1:-1] for line in r.stdout.splitlines() if line[:3].strip("| ").isdigit()]
    assert [(row[0].strip(), row[1].strip()) for row in rows] == [
        ("64×48×32", "headlight (oneDNN)"), ("64×48×32", "PyTorch matmul"),
        ("96×64×128", "headlight (oneDNN)"), ("96×64×128", "PyTorch matmul")]
    for row in rows:
        m, n, k = (int(x) for x in row[0].strip().split("×"))
        ms, gflops, fraction = (float(x) for x in row[2:5])
        assert gflops == pytest.approx(2 * m * n * k / (ms * 1e-3) * 1e-9, rel=0.01)
        assert fraction == pytest.approx(gflops / peak, rel=0.02, abs=0.002)


def test_matmul_compare_refuses_a_bad_shape_by_name():
    import sys
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "matmul_compare.py"), "--shapes",
                        "64x0x32"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--shapes" in r.stderr and "64x0x32" in r.stderr


def test_a_busy_machine_is_reported_beside_the_figures():
    """Another process spinning during the timed runs shows as other_cores (from /proc/stat, less
    this process's own time) and a warning on stderr; the JSON on stdout stays whole."""
    import sys
    spinner = subprocess.Popen([sys.executable, "-c",
                                "import time\nend = time.time() + 20\nwhile time.time() < end: pass"])
    try:
        r = subprocess.run([str(CLI), "bench", "matmul", "--m", "512", "--n", "1024", "--k", "1024",
                            "--runs", "100", "--json"], capture_output=True, text=True, timeout=120,
                           check=True)
    finally:
        spinner.kill()
        spinner.wait()
    d = json.loads(r.stdout)
    assert sum(d["seconds"]) > 0.2  # many ticks of /proc/stat's 10 ms
    assert d["steal_cores"] >= 0
    assert d["other_cores"] >= 0.25, d["other_cores"]
    assert "other processes kept" in r.stderr and "may be low" in r.stderr, r.stderr


def test_showcase_checks_its_sampled_rows_against_the_reference():
    """`bench showcase` on a short sequence: its causal FLOPs 2·N²·D, its rate against the bf16
    peak measured in the same run, and its sampled rows within the float64 reference's bound."""
    n = 3000
    r = subprocess.run([str(CLI), "bench", "showcase", "--seq", str(n), "--sample-rows", "5",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert (j["seq"], j["head_dim"], j["dtype"], j["causal"]) == (n, 64, "bf16", True)
    assert j["flops"] == 2 * n * n * 64 and j["io_bytes"] == 8 * n * 64
    assert j["seconds"] > 0 and j["peak_gflops"] > 0
    assert j["gflops"] == pytest.approx(j["flops"] / j["seconds"] * 1e-9)
    assert j["fraction_of_peak"] == pytest.approx(j["gflops"] / j["peak_gflops"])
    assert j["within_bound"] and j["max_error"] <= j["error_bound"]


def test_bench_showcase_flag_runs_the_showcase_alone():
    """`headlight bench --showcase` is the showcase with its defaults (a million tokens, too long
    to run here); with a benchmark beside it, or with neither, the command says what it wants."""
    r = subprocess.run([str(CLI), "bench", "--showcase", "attention"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "--showcase: runs the showcase alone" in r.stderr, r.stderr
    r = subprocess.run([str(CLI), "bench"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "A subcommand is required" in r.stderr, r.stderr
    r = subprocess.run([str(CLI), "bench", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--showcase" in r.stdout
