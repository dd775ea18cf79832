"""A mechanism is one new module in ldpbench/mechanisms/: importing the package imports every module
of it (in name order), so no import line is to be added anywhere."""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import ldpbench
from ldpbench import mechanisms

TOY = textwrap.dedent("""
    from ldpbench.mechanisms.registry import register

    @register
    class Toy:
        name = "{name}"
    """)
PROBE = """
import json, sys
import ldpbench, ldpbench.mechanisms as m
from ldpbench.mechanisms.registry import MECHANISMS
MECHANISMS.names()  # installed plugins too
print(json.dumps({"file": ldpbench.__file__, "order": list(MECHANISMS._entries),
                  "loaded": sorted(k for k in sys.modules if k.startswith("ldpbench.mechanisms."))}))
"""


def test_a_new_mechanism_module_is_registered_without_an_import_line(tmp_path):
    """A copy of the package with two new modules: both register, in name order (one before the
    built-in modules, one after), while the modules left out (NOT_IMPORTED) stay unloaded."""
    copy = tmp_path / "ldpbench"
    shutil.copytree(Path(ldpbench.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "mechanisms" / "aa_toy.py").write_text(TOY.format(name="toy-first"))
    (copy / "mechanisms" / "zz_toy.py").write_text(TOY.format(name="toy-last"))
    printed = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                             cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": ""}).stdout
    probe = json.loads(printed)
    assert Path(probe["file"]).parent == copy
    order = probe["order"]
    assert "toy-first" in order and "toy-last" in order, order
    assert order.index("toy-first") < order.index("pm") < order.index("toy-last")
    assert set(order) >= set(mechanisms.names())
    assert not {f"ldpbench.mechanisms.{name}" for name in mechanisms.NOT_IMPORTED} & set(probe["loaded"])


def test_every_module_but_those_left_out_is_imported_in_name_order():
    package = Path(mechanisms.__file__).parent
    modules = sorted(path.stem for path in package.glob("*.py") if not path.stem.startswith("_"))
    assert mechanisms.mechanism_modules() == [name for name in modules if name not in mechanisms.NOT_IMPORTED]
    assert mechanisms.NOT_IMPORTED <= set(modules), "a module left out no longer exists: update NOT_IMPORTED"
    assert all(f"ldpbench.mechanisms.{name}" in sys.modules for name in mechanisms.mechanism_modules())
