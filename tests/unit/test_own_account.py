"""Aws.account_id: the operator's own account is asked of STS once per process, however many
threads need it at once."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from provisioner.aws import errors
from provisioner.aws.session import Aws, AwsSettings
from provisioner.kinds.registry import ERROR_CODES

THREADS = 8


class CountingLock:
    """A lock that counts the threads that have come to it (holding it or waiting)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.arrived = threading.Condition()
        self.count = 0

    def __enter__(self) -> None:
        with self.arrived:
            self.count += 1
            self.arrived.notify_all()
        self._lock.acquire()

    def __exit__(self, *_: Any) -> None:
        self._lock.release()


class FakeSts:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls = 0
        self.before_answer: list[Any] = []

    def get_caller_identity(self) -> dict[str, str]:
        self.calls += 1
        for hook in self.before_answer:
            hook()
        if isinstance(self.answer, Exception):
            raise self.answer
        return {"Account": self.answer, "Arn": "arn:aws:iam::123456789012:user/op"}


def aws_with(sts: FakeSts) -> Aws:
    aws = Aws(AwsSettings(region="us-east-1", attempts=1, max_wait=0.0), ERROR_CODES)
    aws.client = lambda *_, **__: sts  # type: ignore[method-assign]
    return aws


def ask_at_once(aws: Aws, sts: FakeSts) -> list[Any]:
    """THREADS threads ask together; STS answers only once every one of them has come to
    the lock, so each would have asked by itself without it."""
    lock = CountingLock()
    aws._own_account_lock = lock  # type: ignore[assignment]

    def all_arrived() -> None:
        with lock.arrived:
            lock.arrived.wait_for(lambda: lock.count >= THREADS, timeout=10)

    sts.before_answer.append(all_arrived)
    results: list[Any] = [None] * THREADS

    def ask(i: int) -> None:
        try:
            results[i] = aws.account_id()
        except errors.CloudError as exc:
            results[i] = exc

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert lock.count == THREADS
    return results


def test_threads_asking_at_once_make_one_sts_call():
    sts = FakeSts("123456789012")
    aws = aws_with(sts)
    assert ask_at_once(aws, sts) == ["123456789012"] * THREADS
    assert sts.calls == 1
    assert aws.account_id() == "123456789012"
    assert sts.calls == 1


def test_threads_asking_at_once_share_one_failure_and_it_stands():
    sts = FakeSts(errors.CredentialsError("no", "InvalidClientTokenId"))
    aws = aws_with(sts)
    results = ask_at_once(aws, sts)
    assert all(isinstance(r, errors.CredentialsError) for r in results)
    assert sts.calls == 1
    with pytest.raises(errors.CredentialsError):
        aws.account_id()
    assert sts.calls == 1


def test_the_ask_at_start_answers_the_first_resources():
    sts = FakeSts("123456789012")
    aws = aws_with(sts)
    aws.ask_own_account_in_background().join(timeout=10)
    assert sts.calls == 1
    assert aws.account_id() == "123456789012"
    assert sts.calls == 1


def test_a_failed_ask_at_start_is_not_held():
    sts = FakeSts(errors.RetryableError("connection refused", "EndpointConnectionError"))
    aws = aws_with(sts)
    aws.ask_own_account_in_background().join(timeout=10)
    assert sts.calls == 1
    sts.answer = "123456789012"
    assert aws.account_id() == "123456789012"
    assert sts.calls == 2
