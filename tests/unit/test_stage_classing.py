"""Stage classing: a resource's effective spec from the ResourceClass that applies, a
refusal kept for its pass, no class served without CloudAccounts, and which resources a
class edit or a namespace's new labels send back for a look."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from provisioner.config import Settings
from provisioner.kinds import registry as kinds
from provisioner.model import conditions as cond
from provisioner.model.classes import ResourceClass
from provisioner.reconciler.classing import Classing
from provisioner.reconciler.state import States
from provisioner.reconciler.workers import Workers
from tests.unit.test_classes import a_class, database, directory, installed_schemas  # noqa: F401


@pytest.fixture
def workers() -> Iterator[tuple[Workers, States]]:
    states = States()
    made = Workers(Settings(workers=2, namespace_max_passes=0), {}, states)
    try:
        yield made, states
    finally:
        made.executor.shutdown(wait=True)
        made.look_executor.shutdown(wait=True)


def parse(body):
    return kinds.parse(body, region="us-east-1", cluster_id="test")


def test_the_spec_is_completed_from_the_class_and_the_use_recorded(workers):
    w, states = workers
    classing = Classing(directory(a_class()), parse, w, states)
    resource = asyncio.run(classing.classed(database()))
    assert resource.class_use is not None and resource.class_use.name == "prod-postgres"
    assert resource.spec.network.subnet_group_name == "private-db"
    assert resource.spec.backup_retention_days == 14
    assert resource.class_refused is None
    assert states.of("u1").classed == ("DatabaseInstance", "shop", "")


def test_a_refusal_is_kept_for_the_pass_and_no_class_is_served_without_accounts(workers):
    w, states = workers
    refused = asyncio.run(
        Classing(directory(a_class()), parse, w, states).classed(database(className="nope"))
    )
    assert refused.class_refused is not None
    assert refused.class_refused.reason == cond.CLASS_NOT_FOUND
    assert refused.class_use is None and refused.spec.network.subnet_group_name is None
    unserved = Classing(None, parse, w, states)
    named = asyncio.run(unserved.classed(database(className="prod-postgres")))
    assert named.class_refused is not None
    assert "serves no ResourceClasses" in named.class_refused.message
    bare = asyncio.run(unserved.classed(database()))
    assert bare.class_refused is None and bare.class_use is None


def test_a_class_edit_sends_back_those_that_name_it_or_take_it_as_default(workers):
    w, states = workers
    classing = Classing(directory(a_class()), parse, w, states)
    asyncio.run(classing.classed(database()))  # the classes are listed at the first use
    states.forget("u1")
    states.of("named").classed = ("DatabaseInstance", "shop", "prod-postgres")
    states.of("bare").classed = ("DatabaseInstance", "shop", "")
    states.of("other").classed = ("DatabaseInstance", "shop", "small")
    states.of("queue").classed = ("Queue", "shop", "")
    states.of("unread")
    now = ResourceClass.from_body(a_class())
    assert sorted(classing.affected(None, now)) == ["bare", "named"]
    not_default = ResourceClass.from_body(a_class(default=False))
    assert classing.affected(not_default, not_default) == ["named"]
    # A namespace's labels changed: everything classed in it is looked at again.
    assert sorted(classing.affected(None, None, namespace="shop")) == [
        "bare",
        "named",
        "other",
        "queue",
    ]
    assert classing.affected(None, None, namespace="dev") == []
