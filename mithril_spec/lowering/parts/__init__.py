"""Which optional pieces of code each template renders, decided here, not in Jinja (the issue's "decisions in
the typed lowering").

A template's pieces that exist only for some programs (a statement for context parallelism, a docstring's
sentence on ZeRO, the swiglu form of an expert MLP) are macros of its section's parts file, `templates/<target>/
<section>_parts.py.j2`, each written once at the indentation it is used at. The template renders a slot as the
macros the lowering names here, in order, on one line:

    {% import "torch/main_parts.py.j2" as P with context %}
    ...
    {% for p in parts.main.after_step %}{{ P[p]() }}{% endfor %}

So the template holds the code and no condition; the module below holds the decision, as Python over the typed
Program, and the lowering golden records it.

Per target, one module per template section: `parts(ctx)` returns {slot: [macro names]} for that section,
every slot given (an empty list renders nothing), and the Program's `parts` is {section: that dict}
(`parts.main.after_backward` in the templates).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import (
    common,
    jax_model,
    jax_pipeline,
    jax_program,
    mlx_program,
    torch_main,
    torch_ops,
    torch_parallel,
    torch_program,
)

Parts = dict[str, list[str]]

# per target: (section, its parts function), the sections its templates render slots of
SECTIONS: dict[str, tuple[tuple[str, Callable[[dict[str, Any]], Parts]], ...]] = {
    "torch": (
        ("main", torch_main.parts),
        ("ops", torch_ops.parts),
        ("parallel", torch_parallel.parts),
        ("program", torch_program.parts),
        ("common", common.parts),
    ),
    "jax": (
        ("model", jax_model.parts),
        ("pipeline", jax_pipeline.parts),
        ("program", jax_program.parts),
        ("common", common.parts),
    ),
    "mlx": (("program", mlx_program.parts), ("common", common.parts)),
}


def program_parts(target: str, ctx: dict[str, Any]) -> dict[str, Parts]:
    """{section: {slot: [macro names]}} of one program; `ctx`: every other field of its Program (the target's
    settings already typed)."""
    out = {}
    for section, fn in SECTIONS[target]:
        slots = fn(ctx)
        bad = [
            s for s, names in slots.items() if not (isinstance(names, list) and all(isinstance(n, str) for n in names))
        ]
        assert not bad, f"{target} {section}: slots {bad} are not lists of macro names"
        out[section] = slots
    return out
