"""Outside ``cadenza/engine/models/`` no code branches on a model family's name: a family is its
module plus one line of the registry, and the rest of cadenza asks the registry or the model
(docs/architecture.md, "Model families"). The import-linter contract in ``pyproject.toml``
keeps the families' modules from being imported; this test keeps their names out of the
comparisons an import does not show: ``config.get("model_type") == "csm"``, ``name in ("csm",
"bark")``, ``case "orpheus":``. Docstrings, help text and default values compare nothing and
pass."""

from __future__ import annotations

import ast
from pathlib import Path

from cadenza.engine.models.registry import BUILT_IN_MODELS, FAMILIES

ROOT = Path(__file__).resolve().parents[2]
FAMILIES_PACKAGE = ROOT / "cadenza" / "engine" / "models"

FAMILY_NAMES = frozenset({*(family.name for family in FAMILIES), *BUILT_IN_MODELS})
"""The registry's families and built-in models."""

ALLOWED: dict[tuple[str, str], str] = {
    # (file, the comparison's source): why it may name a family, when one must.
}


def family_comparisons(source: str) -> list[tuple[int, str]]:
    """``(line, source)`` of every comparison, membership test or ``case`` pattern in
    ``source`` whose string constant (alone, or in a tuple, list, set or dict's keys) is one
    of :data:`FAMILY_NAMES`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        else:
            continue
        if any(_names_a_family(operand) for operand in operands):
            found.append((node.lineno, ast.get_source_segment(source, node) or ""))
    return sorted(found)


def _names_a_family(operand: ast.expr) -> bool:
    if isinstance(operand, (ast.Tuple, ast.List, ast.Set)):
        constants = operand.elts
    elif isinstance(operand, ast.Dict):
        constants = [key for key in operand.keys if key is not None]
    else:
        constants = [operand]
    return any(
        isinstance(constant, ast.Constant) and constant.value in FAMILY_NAMES
        for constant in constants
    )


def _sites() -> dict[tuple[str, str], int]:
    """Every comparison naming a family outside the families' package: ``(file, source)`` to
    its line."""
    sites = {}
    for path in sorted((ROOT / "cadenza").rglob("*.py")):
        if path.is_relative_to(FAMILIES_PACKAGE):
            continue
        relative = path.relative_to(ROOT).as_posix()
        for line, segment in family_comparisons(path.read_text()):
            sites[(relative, segment)] = line
    return sites


def test_no_code_outside_the_families_branches_on_a_family_name() -> None:
    sites = _sites()
    unexplained = [
        f"{file}:{line}: {code}"
        for (file, code), line in sites.items()
        if (file, code) not in ALLOWED
    ]
    assert not unexplained, (
        "ask the registry (cadenza.engine.models.registry) or the model's capabilities, "
        f"not the family's name: {unexplained}"
    )
    gone = [site for site in ALLOWED if site not in sites]
    assert not gone, f"no longer in the code, drop them from ALLOWED: {gone}"


def test_a_branch_on_a_family_name_is_caught_and_text_is_not() -> None:
    source = '''
"""A module about csm and bark."""
DEFAULT_MODEL = "cadenza-tiny"
parser.add_argument("--model", default="cadenza-tiny", help="csm, orpheus or bark")
if config.get("model_type") == "csm":
    pass
if kind in ("orpheus", "other"):
    pass
if "llama" != name and codec == "mimi":
    pass
match name:
    case "bark":
        pass
'''
    assert [code for _, code in family_comparisons(source)] == [
        'config.get("model_type") == "csm"',
        'kind in ("orpheus", "other")',
        '"llama" != name',
        '"bark"',
    ]
