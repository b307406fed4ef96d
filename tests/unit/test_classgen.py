"""The chart's ResourceClass policies are what provisioner_dev.classgen writes from the
kinds' CRDs, and their CEL literals say what the CRDs default."""

from __future__ import annotations

from provisioner_dev import classgen


def test_the_policies_are_current():
    assert classgen.main(["--check"]) == 0


def test_cel_literals():
    assert (
        classgen._cel({"enabled": True, "n": 2, "s": "it's"})
        == "{'enabled': true, 'n': 2, 's': 'it\\'s'}"
    )
    assert classgen._cel([None, False]) == "[null, false]"


def test_a_class_never_sets_the_cloud_name_or_its_own_tags():
    fields = classgen.class_fields()
    assert "queueName" not in fields["Queue"] and "tags" not in fields["Queue"]
    assert "instanceIdentifier" not in fields["DatabaseInstance"]
    assert "network" in fields["DatabaseInstance"] and "className" not in fields["Topic"]
