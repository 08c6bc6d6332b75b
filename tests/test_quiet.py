"""`pytest -q` prints nothing but its own lines: no test writes to standard output itself.

Tests state what they found in their assertion messages (shown when they fail), never with
print(), which ``pytest -s`` and ``-rP`` echo as stray lines. The scripts that tests start as
separate processes (and read the output of) are exempt."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SUBPROCESS_SCRIPTS = {TESTS / "executor" / "ckpt_crash.py", TESTS / "executor" / "optim_sweep.py"}


def prints_in(path: Path) -> list[int]:
    """Lines of print() calls in ``path`` (strings that hold a script's source are not code here)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"]


def test_no_test_prints():
    found = {str(p.relative_to(TESTS)): prints_in(p) for p in sorted(TESTS.rglob("*.py"))
             if p not in SUBPROCESS_SCRIPTS}
    assert not {k: v for k, v in found.items() if v}


def test_the_check_sees_a_print(tmp_path):
    f = tmp_path / "t.py"
    f.write_text("def test_x():\n    x = 1\n    print(f'fp16: {x} B per rank and step')\n")
    assert prints_in(f) == [3]
