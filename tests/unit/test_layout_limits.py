"""The house's size limits, read from the source: no module over 450 lines, no class over
300, no function over 60, in the operator's package, the dev harness and the benchmarks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["provisioner", "provisioner_dev", "bench"]
MODULE, CLASS, FUNCTION = 450, 300, 60


def sources() -> list[Path]:
    return sorted(p for name in PACKAGES for p in (ROOT / name).rglob("*.py"))


def test_there_is_source_to_measure():
    assert len(sources()) > 100


@pytest.mark.parametrize("package", PACKAGES)
def test_modules_classes_and_functions_stay_within_their_limits(package):
    over = []
    for path in (ROOT / package).rglob("*.py"):
        text = path.read_text()
        where = path.relative_to(ROOT)
        if (lines := len(text.splitlines())) > MODULE:
            over.append(f"{where}: module of {lines} lines (limit {MODULE})")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            if isinstance(node, ast.ClassDef) and size > CLASS:
                over.append(f"{where}: class {node.name} of {size} lines (limit {CLASS})")
            elif not isinstance(node, ast.ClassDef) and size > FUNCTION:
                over.append(f"{where}: function {node.name} of {size} lines (limit {FUNCTION})")
    assert over == []
