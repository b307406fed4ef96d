"""The client-side AWS call budget: token buckets, AIMD, throttle absorption, thread safety.

Time is a fake clock that only `sleep` moves: no test sleeps for real.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import boto3
import botocore.exceptions
import pytest
from botocore.stub import Stubber

from provisioner.aws import errors
from provisioner.aws.budget import (
    BudgetSettings,
    BudgetSpecError,
    CallBudget,
    Limit,
    parse_limits,
)
from provisioner.aws.session import Aws, AwsSettings
from provisioner.runtime import metrics


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []
        self._lock = threading.Lock()

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.slept.append(seconds)
            self.now += seconds


class FakeClient:
    """What CallBudget reads of a boto3 client: meta, and bound methods named like its API."""

    def __init__(self, service: str, region: str = "us-east-1", answers: list | None = None):
        self.meta = SimpleNamespace(
            service_model=SimpleNamespace(service_name=service),
            region_name=region,
            method_to_api_mapping={
                "describe_db_instances": "DescribeDBInstances",
                "list_queue_tags": "ListQueueTags",
                "get_queue_attributes": "GetQueueAttributes",
            },
        )
        self.answers = list(answers or [])
        self.calls = 0

    def _answer(self):
        self.calls += 1
        answer = self.answers.pop(0) if self.answers else "ok"
        if isinstance(answer, Exception):
            raise answer
        return answer

    def describe_db_instances(self):
        return self._answer()

    def list_queue_tags(self):
        return self._answer()

    def get_queue_attributes(self):
        return self._answer()


def throttle(code: str = "Throttling") -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": "Rate exceeded"}}, "DescribeDBInstances"
    )


def budget_with(t: FakeTime, **limits: Limit | None) -> CallBudget:
    settings = BudgetSettings(limits={k.replace("_", "."): v for k, v in limits.items()})
    return CallBudget(settings, clock=t.clock, sleep=t.sleep)


def rds_bucket(budget: CallBudget):
    return budget.buckets_for("rds", "us-east-1", "DescribeDBInstances")[0]


def test_burst_passes_then_calls_wait_for_the_refill():
    t = FakeTime()
    budget = budget_with(t, rds=Limit(burst=3, rate=2))
    client = FakeClient("rds")
    for _ in range(3):
        budget.run(client.describe_db_instances)
    assert t.slept == []
    budget.run(client.describe_db_instances)
    budget.run(client.describe_db_instances)
    assert t.slept == [pytest.approx(0.5), pytest.approx(0.5)]


def test_a_throttle_halves_the_rate_empties_the_bucket_and_the_call_is_retried():
    t = FakeTime()
    budget = budget_with(t, rds=Limit(burst=10, rate=4))
    client = FakeClient("rds", answers=[throttle(), "done"])
    assert budget.run(client.describe_db_instances) == "done"
    assert client.calls == 2
    # The retry waited for a token at the halved rate (2/s) from an emptied bucket.
    assert t.slept == [pytest.approx(0.5)]
    bucket = rds_bucket(budget)
    assert bucket.rate == pytest.approx(2 + 4 * 0.02)  # halved, then one success added back
    assert bucket.capacity == pytest.approx(10 * bucket.rate / 4)


def test_successes_bring_the_rate_back_slowly_and_never_above_the_documented_one():
    t = FakeTime()
    budget = budget_with(t, rds=Limit(burst=100, rate=10))
    bucket = rds_bucket(budget)
    bucket.throttled(t.now)
    assert bucket.rate == 5
    rates = []
    for _ in range(30):
        bucket.succeeded(t.now)
        rates.append(bucket.rate)
    assert rates[0] == pytest.approx(5.2)  # +2 % of the documented rate per success
    assert rates == sorted(rates)
    assert rates[24] == pytest.approx(10) and max(rates) == pytest.approx(10)


def test_the_rate_never_falls_below_its_floor():
    t = FakeTime()
    budget = budget_with(t, rds=Limit(burst=100, rate=10))
    bucket = rds_bucket(budget)
    for _ in range(50):
        bucket.throttled(t.now)
    assert bucket.rate == pytest.approx(0.5)  # 5 % of 10
    assert bucket.capacity == pytest.approx(5)


def test_the_calls_in_flight_when_the_limit_is_hit_halve_the_rate_once():
    t = FakeTime()
    budget = budget_with(t, rds=Limit(burst=2, rate=4))
    buckets = budget.buckets_for("rds", "us-east-1", "DescribeDBInstances")
    # Ten calls take their tokens at the documented pace; every one is answered Throttling.
    reserved = []
    for _ in range(10):
        reserved.append(t.now)
        budget.acquire("rds", buckets)
    for at in reserved:
        assert budget.throttled("rds", buckets, at)
    assert buckets[0].rate == 2  # one decrease for the whole burst, not ten (down to 0.2)
    # A call paced by the new rate and throttled again: the new rate is too high as well.
    t.now += 1
    budget.throttled("rds", buckets, t.now - 0.5)
    assert buckets[0].rate == 1


def test_calls_already_waiting_keep_their_turn_when_the_rate_comes_back():
    t = FakeTime()
    budget = budget_with(t, rds=Limit(burst=1, rate=10))
    bucket = rds_bucket(budget)
    bucket.throttled(t.now)  # 5 per second, empty
    waits = [bucket.reserve(t.now) for _ in range(5)]
    assert waits == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    for _ in range(25):  # successes meanwhile bring the documented 10 per second back
        bucket.succeeded(t.now)
    assert bucket.rate == pytest.approx(10)
    # The next call goes after the five already promised (1.0 s), not alongside them.
    assert bucket.reserve(t.now) == pytest.approx(1.0 + 1 / 10)


def test_throttling_is_absorbed_until_the_bucket_was_throttled_too_long():
    t = FakeTime()
    settings = BudgetSettings(limits={"rds": Limit(burst=5, rate=1)}, max_throttled_seconds=30)
    budget = CallBudget(settings, clock=t.clock, sleep=t.sleep)
    client = FakeClient("rds", answers=[throttle()] * 1000)
    started = t.now
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        budget.run(client.describe_db_instances)
    assert raised.value.response["Error"]["Code"] == "Throttling"
    assert client.calls > 3  # absorbed several times first
    assert 30 < t.now - started < 60  # given up soon after the documented time


def test_a_success_ends_the_throttled_streak():
    t = FakeTime()
    settings = BudgetSettings(limits={"rds": Limit(burst=5, rate=10)}, max_throttled_seconds=1)
    budget = CallBudget(settings, clock=t.clock, sleep=t.sleep)
    # Two streaks of two throttles, 0.2 s then 0.74 s long: 1.34 s together, never 1 s in a row.
    answers = [throttle()] * 2 + ["ok"] + [throttle()] * 2 + ["ok"]
    client = FakeClient("rds", answers=answers)
    assert budget.run(client.describe_db_instances) == "ok"
    assert budget.run(client.describe_db_instances) == "ok"
    assert rds_bucket(budget).throttled_since is None


def test_other_errors_pass_through_at_once():
    t = FakeTime()
    budget = budget_with(t, rds=Limit(burst=5, rate=1))
    denied = botocore.exceptions.ClientError(
        {"Error": {"Code": "AccessDenied", "Message": "no"}}, "DescribeDBInstances"
    )
    client = FakeClient("rds", answers=[denied])
    with pytest.raises(botocore.exceptions.ClientError):
        budget.run(client.describe_db_instances)
    assert client.calls == 1


def test_sqs_tagging_has_its_own_bucket_and_other_sqs_calls_none():
    t = FakeTime()
    budget = CallBudget(clock=t.clock, sleep=t.sleep)  # the documented defaults
    client = FakeClient("sqs")
    for _ in range(7):
        budget.run(client.list_queue_tags)
    assert sum(t.slept) == pytest.approx(2 / 5)  # 5 in a burst, then 5 per second
    t.slept.clear()
    for _ in range(100):
        budget.run(client.get_queue_attributes)
    assert t.slept == []
    assert [row["bucket"] for row in budget.snapshot()] == ["sqs.tagging"]


def test_functions_that_are_not_client_methods_are_not_budgeted():
    t = FakeTime()
    budget = budget_with(t, rds=Limit(burst=1, rate=1))
    assert [budget.run(str, n) for n in range(5)] == ["0", "1", "2", "3", "4"]
    assert t.slept == []


def test_threads_share_one_bucket_without_losing_a_token():
    t = FakeTime()
    t.sleep = lambda seconds: t.slept.append(seconds)  # time stands still
    budget = budget_with(t, rds=Limit(burst=50, rate=10))
    bucket = rds_bucket(budget)
    threads, per_thread = 8, 200
    barrier = threading.Barrier(threads)

    def worker():
        barrier.wait()
        for _ in range(per_thread):
            budget.acquire("rds", [bucket])

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=30)
    total = threads * per_thread
    assert bucket.tokens == pytest.approx(50 - total)
    # Every call past the burst got its own slot in the queue: waits 0.1, 0.2, ... exactly once.
    assert sorted(round(w, 6) for w in t.slept) == [round(k / 10, 6) for k in range(1, total - 49)]


def test_aws_call_absorbs_a_real_clients_throttling_and_counts_it():
    t = FakeTime()
    aws = Aws(AwsSettings(region="us-east-1", max_wait=0.0))
    aws.budget.clock, aws.budget.sleep = t.clock, t.sleep
    rds = boto3.client(
        "rds", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
    )
    before = metrics.THROTTLES.labels("rds")._value.get()
    with Stubber(rds) as stub:
        for _ in range(5):  # more than Aws.call's own 4 attempts
            stub.add_client_error("describe_db_instances", "Throttling", http_status_code=400)
        stub.add_response("describe_db_instances", {"DBInstances": []})
        assert aws.call(rds.describe_db_instances) == {"DBInstances": []}
    assert metrics.THROTTLES.labels("rds")._value.get() - before == 5
    assert aws.budget.snapshot()[0]["bucket"] == "rds"
    assert aws.budget.snapshot()[0]["rate"] < 12


def test_aws_call_reports_throttling_past_the_limit_as_retryable():
    t = FakeTime()
    settings = AwsSettings(
        region="us-east-1", attempts=1, max_wait=0.0, budget=BudgetSettings(max_throttled_seconds=0)
    )
    aws = Aws(settings)
    aws.budget.clock, aws.budget.sleep = t.clock, t.sleep
    sqs = boto3.client(
        "sqs", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
    )
    with Stubber(sqs) as stub:
        stub.add_client_error("list_queue_tags", "RequestThrottled", http_status_code=403)
        with pytest.raises(errors.RetryableError):
            aws.call(sqs.list_queue_tags, QueueUrl="https://sqs.us-east-1.amazonaws.com/1/q")


def test_budget_specs_parse_or_say_what_is_wrong():
    assert parse_limits("rds=100:5, sqs.tagging=off") == {
        "rds": Limit(100, 5),
        "sqs.tagging": None,
    }
    settings = BudgetSettings.from_spec("s3=off", 30)
    assert settings.limits["s3"] is None and settings.limits["rds"] == Limit(300, 12)
    assert settings.max_throttled_seconds == 30
    for bad, words in [
        ("rds", "expected NAME=BURST:RATE"),
        ("rds=12", "BURST must be >= 1"),
        ("rds=0:1", "BURST must be >= 1"),
        ("rds=10:-1", "RATE > 0"),
        ("ec2=1:1", "unknown name 'ec2'"),
    ]:
        with pytest.raises(BudgetSpecError, match=words):
            parse_limits(bad)
    with pytest.raises(BudgetSpecError, match="max throttled seconds"):
        BudgetSettings.from_spec("", -1)


def test_sharded_replicas_each_spend_their_share_of_the_account_limits():
    t = FakeTime()
    budget = budget_with(t, rds=Limit(burst=6, rate=3))
    before = rds_bucket(budget)
    budget.set_share(1 / 3)  # three replicas call the same account
    assert before.rate == pytest.approx(1.0) and before.capacity == pytest.approx(2.0)
    client = FakeClient("rds")
    budget.run(client.describe_db_instances)
    budget.run(client.describe_db_instances)
    assert t.slept == []
    budget.run(client.describe_db_instances)
    assert t.slept == [pytest.approx(1.0)]  # 1 call/s: a third of 3
    # An adapted (throttled) rate keeps its proportion; recovery stops at the share.
    before.throttled(t.now)
    assert before.rate == pytest.approx(0.5)
    budget.set_share(1 / 2)
    assert before.rate == pytest.approx(0.75)
    for _ in range(100):
        before.succeeded(t.now)
    assert before.rate == pytest.approx(1.5)
    # Buckets made later start at the share too.
    sqs = budget.buckets_for("rds", "eu-west-1", "DescribeDBInstances")[0]
    assert sqs.rate == pytest.approx(1.5) and sqs.capacity == pytest.approx(3.0)
