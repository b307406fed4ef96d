"""bench/ack.py's pure parts (bench/lib/ack_*.py): which bucket a request names, calls grouped
by bucket, API writes by category, the targets and the table (the run itself needs ACK's
controller)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from bench.lib.ack_controller import MOTO_SITECUSTOMIZE
from bench.lib.ack_counts import api_writes, bucket_of, calls_by_bucket, read_entries, rss_split
from bench.lib.ack_report import table, targets
from bench.lib.ack_run import ack_side, ours_side
from bench.lib.recording import BENCH_USER_AGENT, Recording

HOST = "127.0.0.1"
AUTH = "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/{}/aws4_request, Sig=x"


def entry(method: str, url: str, service: str = "s3", agent: str = "aws-sdk-go-v2") -> dict:
    return {
        "method": method,
        "url": url,
        "headers": {"Authorization": AUTH.format(service), "User-Agent": agent},
        "body": "",
        "body_encoded": False,
    }


def test_bucket_of_path_and_virtual_host_styles() -> None:
    assert bucket_of("http://127.0.0.1:5000/ack-bench-1-00001?versioning", HOST) == (
        "ack-bench-1-00001"
    )
    assert bucket_of("http://127.0.0.1:5000/b1/some/key", HOST) == "b1"
    assert bucket_of("http://b2.127.0.0.1:5000/?tagging", HOST) == "b2"
    assert bucket_of("http://127.0.0.1:5000/", HOST) is None


def test_calls_by_bucket_groups_and_leaves_the_bench_out(tmp_path: Path) -> None:
    recording = Recording(tmp_path / "rec.jsonl", tmp_path / "moto.log")
    base = "http://127.0.0.1:5000"
    entries = [
        entry("PUT", f"{base}/a"),
        entry("GET", f"{base}/a?tagging"),
        entry("GET", f"{base}/a?tagging"),
        entry("PUT", f"{base}/b"),
        entry("GET", f"{base}/"),  # ListBuckets: names none
        entry("GET", f"{base}/a?versioning", agent=f"Boto3/1 {BENCH_USER_AGENT}"),
    ]
    sts = entry("POST", f"{base}/", service="sts")
    sts["body"] = "Action=GetCallerIdentity&Version=2011-06-15"
    entries.append(sts)
    found = calls_by_bucket(entries, recording, HOST)
    assert found["total"] == 6
    assert found["by_service"] == {"s3": 5, "sts": 1}
    assert found["buckets_named"] == 2
    assert found["per_named_bucket"] == {"min": 1, "p50": 2.0, "max": 3}
    assert found["by_action"] == {"s3:GET ?tagging": 2, "s3:PUT bucket": 2}
    assert found["naming_no_bucket"] == {"s3:GET bucket": 1, "sts:GetCallerIdentity": 1}


def test_read_entries_between_offsets(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    lines = [json.dumps({"url": f"/{i}"}) + "\n" for i in range(3)]
    path.write_text("".join(lines) + "not json\n")
    start = len(lines[0])
    assert [e["url"] for e in read_entries(path, start, path.stat().st_size)] == ["/1", "/2"]
    assert read_entries(path, 10, 10) == []


def test_api_writes_leave_the_bench_creates_and_deletes_out() -> None:
    delta: Counter[tuple[str, str, str, str, str]] = Counter(
        {
            ("s3.services.k8s.aws", "buckets", "", "POST", "201"): 500,
            ("s3.services.k8s.aws", "buckets", "", "PATCH", "200"): 500,
            ("s3.services.k8s.aws", "buckets", "status", "PATCH", "200"): 1000,
            ("", "events", "", "POST", "201"): 3,
            ("coordination.k8s.io", "leases", "", "PUT", "200"): 4,
        }
    )
    found = api_writes(delta, "s3.services.k8s.aws", "buckets")
    assert found["total"] == 1503
    assert (found["cr"], found["cr_status"], found["event"], found["secret"]) == (500, 1000, 3, 0)
    assert found["other"] == {"leases PUT": 4}


def test_sides_make_unique_manifests_and_read_their_condition() -> None:
    ack = ack_side("42")
    body = ack.manifest(7)
    assert body["apiVersion"] == "s3.services.k8s.aws/v1alpha1"
    assert body["spec"] == {"name": "ack-bench-42-00007"}
    assert ack.path() == "/apis/s3.services.k8s.aws/v1alpha1/namespaces/ack-bench/buckets"
    synced = {"status": {"conditions": [{"type": "ACK.ResourceSynced", "status": "True"}]}}
    assert ack.ready(synced)
    assert not ack.ready({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    ours = ours_side()
    assert ours.manifest(1)["spec"] == {}
    assert ours.ready({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert not ours.ready({})


def figures(ours_calls: float, ours_rss: float, ack_rss: float) -> dict:
    def side(label: str, calls: float, rss: float) -> dict:
        return {
            "controller": label,
            "created": 500,
            "all_ready_seconds": 30.5,
            "aws_calls_per_bucket": calls,
            "peak_rss_mb": rss,
            "rss_before_first_cr_mb": rss / 2,
            "buckets_left_in_moto": 0,
            "aws_calls": {
                "by_action": {"s3:PUT bucket": 500},
                "naming_no_bucket": {"s3:GET bucket": 2},
                "per_named_bucket": {"min": 6, "p50": 6.0, "max": 6},
                "buckets_named": 500,
            },
            "errors": [],
        }

    return {
        "ack": side("ACK s3-controller v1.10.0", 40.0, ack_rss),
        "ours": side("provisioner", ours_calls, ours_rss),
    }


def test_targets_met_and_missed() -> None:
    met = targets(figures(6.0, 60.0, 50.0))
    assert met["calls_per_bucket"]["met"] and met["peak_rss_ratio"] == {
        "value": 1.2,
        "target": 1.2,
        "met": True,
    }
    missed = targets(figures(6.5, 100.0, 50.0))
    assert missed["calls_per_bucket"]["met"] is False
    assert missed["peak_rss_ratio"]["value"] == 2.0 and missed["peak_rss_ratio"]["met"] is False
    assert targets({"ours": {"aws_calls_per_bucket": 3.0}})["peak_rss_ratio"]["met"] is None


def test_table_has_both_columns_and_the_verdicts() -> None:
    text = table(figures(6.5, 100.0, 50.0))
    assert "ACK s3-controller v1.10.0" in text and "provisioner" in text
    row = next(line for line in text.splitlines() if line.startswith("peak RSS"))
    assert "50.0 MB" in row and "100.0 MB" in row
    assert "AWS calls per bucket to Ready: 6.50 MISSED" in text
    assert "our peak RSS <= 1.2x ACK's: 2.00x MISSED" in text
    assert "s3:PUT bucket 1.00" in text
    assert "min 6, p50 6.00, max 6 over 500 buckets" in text
    one = table({"ours": figures(6.0, 1.0, 1.0)["ours"]})
    assert "ACK" not in one.splitlines()[0]


def test_rss_split_reads_this_process() -> None:
    split = rss_split(os.getpid())
    assert set(split) == {"VmRSS", "RssAnon", "RssFile", "RssShmem"}
    assert split["VmRSS"] and split["RssAnon"] and split["VmRSS"] >= split["RssAnon"]


def test_moto_answers_the_default_encryption_with_the_hook(tmp_path: Path) -> None:
    """moto's S3 backend, loaded with MOTO_SITECUSTOMIZE on the path, answers AWS's default
    encryption for a bucket nobody configured, and what was configured otherwise."""
    (tmp_path / "sitecustomize.py").write_text(MOTO_SITECUSTOMIZE)
    probe = (
        "from moto.s3.models import s3_backends\n"
        "b = s3_backends['123456789012']['aws']\n"
        "b.create_bucket('plain', 'us-east-1')\n"
        "b.create_bucket('kms', 'us-east-1')\n"
        "rule = {'Rule': {'ApplyServerSideEncryptionByDefault': {'SSEAlgorithm': 'aws:kms'}}}\n"
        "b.put_bucket_encryption('kms', rule)\n"
        "print(b.get_bucket_encryption('plain')['Rule']"
        "['ApplyServerSideEncryptionByDefault']['SSEAlgorithm'])\n"
        "print(b.get_bucket_encryption('kms')['Rule']"
        "['ApplyServerSideEncryptionByDefault']['SSEAlgorithm'])\n"
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["AES256", "aws:kms"]
