"""The pruned botocore data the operator ships (provisioner/aws/botodata.py says why).

Written from the installed (pinned) botocore's own files into provisioner/aws/botocore_data/:

- `endpoints.json`: botocore's endpoint table, every partition with its regions and defaults,
  and of its services only those of botodata.SERVICES (by their endpoint prefix: the
  resourcegroupstaggingapi client's is `tagging`), each entry as botocore has it;
- `<service>/<version>/service-2.json` for S3 and EC2: the model with the operations of
  botodata.OPERATIONS, the shapes they reach (input, output, errors, and every member's shape
  in turn) and every exception shape, every `documentation` in it emptied;
- the same for every other service of botodata.SERVICES, with all its operations.

    python -m provisioner_dev.botocore_data          # rewrite the files
    python -m provisioner_dev.botocore_data --check  # exit 1 when one is stale

Run it after changing botocore's pin, botodata.SERVICES or botodata.OPERATIONS;
tests/unit/test_botocore_data.py fails until then.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import botocore.exceptions
import botocore.loaders

from provisioner.aws import botodata


class BotocoreDataError(Exception):
    pass


def builtin_loader() -> botocore.loaders.Loader:
    """botocore's own files only (no AWS_DATA_PATH, no ~/.aws/models, not the pruned ones)."""
    return botocore.loaders.Loader(
        extra_search_paths=[botocore.loaders.Loader.BUILTIN_DATA_PATH],
        include_default_search_paths=False,
    )


def endpoint_prefix(loader: botocore.loaders.Loader, service: str) -> str:
    return str(loader.load_service_model(service, "service-2")["metadata"]["endpointPrefix"])


def pruned_endpoints(loader: botocore.loaders.Loader) -> dict[str, Any]:
    table = loader.load_data("endpoints")
    prefixes = {endpoint_prefix(loader, s) for s in botodata.SERVICES}
    partitions = []
    for partition in table["partitions"]:
        kept = dict(partition)
        kept["services"] = {k: v for k, v in partition["services"].items() if k in prefixes}
        partitions.append(kept)
    missing = prefixes - {k for p in partitions for k in p["services"]}
    if missing:
        raise BotocoreDataError(f"botocore's endpoint table has no {', '.join(sorted(missing))}")
    return {**table, "partitions": partitions}


def without_documentation(value: Any) -> Any:
    """Every `documentation` emptied (kept as "": botocore reads some of them by key)."""
    if isinstance(value, dict):
        return {
            k: "" if k == "documentation" else without_documentation(v) for k, v in value.items()
        }
    if isinstance(value, list):
        return [without_documentation(v) for v in value]
    return value


def shapes_reached(shapes: dict[str, Any], roots: list[str], service: str = "s3") -> set[str]:
    """The shapes `roots` name and every shape their members, lists and maps name in turn."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        if name not in shapes:
            raise BotocoreDataError(f"{service}'s model names a shape it does not define: {name}")
        seen.add(name)
        shape = shapes[name]
        todo += [m["shape"] for m in shape.get("members", {}).values()]
        todo += [shape[k]["shape"] for k in ("member", "key", "value") if k in shape]
    return seen


def model_version(loader: botocore.loaders.Loader, service: str) -> str:
    return str(loader.determine_latest_version(service, "service-2"))


def sdk_extra_shapes(loader: botocore.loaders.Loader, service: str) -> list[str]:
    """The shapes the service's `service-2.sdk-extras.json` merges into, if it has one."""
    name = f"{service}/{model_version(loader, service)}/service-2.sdk-extras"
    try:
        extras = loader.load_data(name)
    except botocore.exceptions.DataNotFoundError:
        return []
    return sorted(extras.get("merge", {}).get("shapes", {}))


def pruned_model(loader: botocore.loaders.Loader, service: str) -> dict[str, Any]:
    """`service`'s model without documentation and, where botodata.OPERATIONS lists its
    operations, with only those and the shapes they reach."""
    # The file alone, as botocore ships it: the loader adds its sdk-extras when it loads ours.
    model = loader.load_data(f"{service}/{model_version(loader, service)}/service-2")
    wanted = botodata.OPERATIONS.get(service)
    if wanted is None:
        return dict(without_documentation(model))
    operations = model["operations"]
    missing = [op for op in wanted if op not in operations]
    if missing:
        raise BotocoreDataError(f"{service}'s model has no operation {', '.join(missing)}")
    kept_ops = {name: operations[name] for name in operations if name in wanted}
    roots = [
        ref["shape"]
        for op in kept_ops.values()
        for ref in [op.get("input"), op.get("output"), *op.get("errors", [])]
        if ref
    ]
    roots += [name for name, shape in model["shapes"].items() if shape.get("exception")]
    # The shapes botocore's sdk-extras add members to when it loads the model: kept whole,
    # or the merge would leave a shape with no type.
    roots += [name for name in sdk_extra_shapes(loader, service) if name in model["shapes"]]
    reached = shapes_reached(model["shapes"], roots, service)
    pruned = {
        **model,
        "operations": kept_ops,
        "shapes": {k: v for k, v in model["shapes"].items() if k in reached},
    }
    return dict(without_documentation(pruned))


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1) + "\n"


def files(loader: botocore.loaders.Loader | None = None) -> dict[Path, str]:
    """What the generator writes: path -> text."""
    loader = loader or builtin_loader()
    written = {botodata.DATA_DIR / "endpoints.json": render(pruned_endpoints(loader))}
    for service in botodata.SERVICES:
        path = botodata.DATA_DIR / service / model_version(loader, service) / "service-2.json"
        written[path] = render(pruned_model(loader, service))
    return written


def unexpected(expected: dict[Path, str]) -> list[Path]:
    """Files under DATA_DIR the generator would not write (a model of an older version)."""
    if not botodata.DATA_DIR.is_dir():
        return []
    return sorted(p for p in botodata.DATA_DIR.rglob("*") if p.is_file() and p not in expected)


def stale(expected: dict[Path, str] | None = None) -> list[Path]:
    expected = expected if expected is not None else files()
    found = [p for p, text in expected.items() if not p.is_file() or p.read_text() != text]
    return found + unexpected(expected)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m provisioner_dev.botocore_data", description=__doc__
    )
    parser.add_argument("--check", action="store_true", help="only say which files are stale")
    args = parser.parse_args(argv)
    try:
        expected = files()
    except BotocoreDataError as exc:
        print(f"botocore_data: {exc}", file=sys.stderr)
        return 1
    if args.check:
        found = stale(expected)
        for path in found:
            print(f"{path} is stale: run python -m provisioner_dev.botocore_data", file=sys.stderr)
        return 1 if found else 0
    for path in unexpected(expected):
        path.unlink()
        print(f"removed {path}")
    for path, text in expected.items():
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path} ({len(text):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
