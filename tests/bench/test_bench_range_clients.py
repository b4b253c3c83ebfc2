"""``python -m benchmarks range_clients`` at a tiny size: every candidate client returns the file's bytes from
nginx (and moto's S3 server), is timed in every pattern, and its checks (abort on a deadline, redirects,
Python calls per GB) come out. Nothing about any client's speed is asserted."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from conftest import require_nginx, skip_or_fail

REPO = Path(__file__).resolve().parents[2]
CLIENTS = {"ckptfs urllib3", "ckptfs libcurl", "_curl into", "urllib3 readinto", "pycurl easy", "pycurl multi",
           "obstore"}
PATTERNS = {"stream", "8 in flight", "random 1 MiB"}


def test_the_range_client_bench_times_every_client_and_checks_them(tmp_path):
    require_nginx()
    for module in ("pycurl", "obstore", "moto"):
        if importlib.util.find_spec(module) is None:
            skip_or_fail(f"{module} is not installed (the bench and test-oracles extras)")
    out_file = tmp_path / "r.json"
    out = subprocess.run([sys.executable, "-m", "benchmarks", "range_clients", "--mib", "12", "--rounds", "1",
                          "--random", "3", "--s3", "--s3-mib", "10", "--out", str(out_file)],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "every client's bytes equal the file's" in out.stdout
    results = json.loads(out_file.read_text())
    assert set(results["nginx"]) == PATTERNS
    for per in results["nginx"].values():
        assert set(per) == CLIENTS
        assert all(fig["mbps"] > 0 and fig["cpu_s_per_gb"] >= 0 for fig in per.values())
    assert set(results["s3"]) == PATTERNS
    assert set(results["s3"]["stream"]) == {"ckptfs libcurl", "ckptfs boto3", "pycurl easy", "pycurl multi", "obstore"}
    checks = results["checks"]
    assert set(checks) == CLIENTS
    # 12 MiB behind a 2 MB/s cap takes 6 s: every candidate ends the range on its 0.5 s deadline instead
    assert all(c["abort"].startswith("yes") for c in checks.values()), checks
    # libcurl and urllib3 hand the 302 back; obstore (reqwest) follows it on its own
    for name in ("_curl into", "urllib3 readinto", "pycurl easy", "pycurl multi"):
        assert checks[name]["no redirect"].startswith("yes"), checks
    assert checks["obstore"]["no redirect"].startswith("no"), checks
    assert all(c["python calls/GB"] > 0 for c in checks.values())


def test_over_https_every_client_is_handed_the_ca_and_refuses_the_server_without_it(tmp_path):
    require_nginx()
    for module in ("pycurl", "obstore"):
        if importlib.util.find_spec(module) is None:
            skip_or_fail(f"{module} is not installed (the bench extra)")
    out_file = tmp_path / "r.json"
    out = subprocess.run([sys.executable, "-m", "benchmarks", "range_clients", "--mib", "12", "--rounds", "1",
                          "--random", "3", "--tls", "--out", str(out_file)],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "every client's bytes equal the file's" in out.stdout  # each trusted the CA it was handed
    results = json.loads(out_file.read_text())
    assert results["tls"] is True
    assert all(set(per) == CLIENTS for per in results["nginx"].values())
    checks = results["checks"]
    refused = {name: c["refuses an unknown CA"] for name, c in checks.items() if "refuses an unknown CA" in c}
    assert set(refused) == CLIENTS - {"ckptfs urllib3", "ckptfs libcurl"}, checks
    assert all(r.startswith("yes") for r in refused.values()), refused
    assert all(c["abort"].startswith("yes") for c in checks.values()), checks
