"""The mesh axes and the typed mesh (mithril_spec/axes.py): defined once, read as `mesh.tensor`,
`mesh.tensor_enabled` rather than `sizes.get("tensor", 1)`."""

from __future__ import annotations

import ast
from pathlib import Path

from mithril_spec.axes import CONTEXT, MESH_AXES, Dims, ParallelDims
from mithril_spec.frontend import compile_file
from mithril_spec.planner.mesh import Mesh

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "mithril_spec"


def test_parallel_dims():
    d = Dims({"data": 2, "tensor": 4})
    assert (d.pipe, d.data, d.fsdp, d.expert, d.context, d.tensor) == (1, 2, 1, 1, 1, 4)
    assert d.data_enabled and d.tensor_enabled and not d.pipe_enabled and not d.context_enabled
    assert d.axes == ("data", "tensor") and d.shape == (2, 4) and d.devices == 8
    assert d.degree(("data", "tensor")) == 8 and d.degree(()) == 1 and d.size("fsdp") == 1


def test_the_plans_mesh_is_parallel_dims():
    plan = compile_file(ROOT / "specs" / "gpt-tiny.yaml", "data=2,tensor=2").plan
    assert isinstance(plan.mesh, Mesh) and isinstance(plan.mesh, ParallelDims)
    assert plan.mesh.tensor == 2 and plan.mesh.tensor_enabled and not plan.mesh.fsdp_enabled
    assert set(plan.mesh.sizes) == set(MESH_AXES)


def test_the_axes_are_defined_once():
    """No module but axes.py assigns the axis tuple or an axis name to a module-level constant."""
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        if path.name == "axes.py" and path.parent == PKG:
            continue
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.Constant)):
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    continue
                if value == MESH_AXES or (value == CONTEXT and any(
                        isinstance(t, ast.Name) and t.id.isupper() for t in node.targets)):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, "mesh axes defined again (import them from mithril_spec/axes.py):\n" + "\n".join(offenders)
