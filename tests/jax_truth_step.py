"""A small JAX train step built directly from a plan, for checking the cost model against XLA.

Run as a script (in a subprocess, so that XLA_FLAGS can give it 8 simulated CPU devices):

    python tests/jax_truth_step.py OUT.json SPEC MESH [SPEC MESH ...]

It interprets the resolved graph with jax.numpy (parameters in their canonical layouts, sharded with the
plan's partition specs through NamedSharding; activations constrained to the layouts the sharding rules
give them, batch over the batch axes), compiles one optimizer step with jax.jit, and writes:

- every collective in `compiled.as_text()`: kind, mesh axes (from the replica groups), payload bytes;
- `compiled.memory_analysis()`;
- the bytes of one device's shard of every parameter and optimizer-state array.

This is test scaffolding, not the generated program (which lives in templates/jax/).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from mithril_spec.frontend import compile_file  # noqa: E402
from mithril_spec.graph import RepeatNode  # noqa: E402


DT = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16, "int32": jnp.int32,
      "int64": jnp.int64}
BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s64": 8, "pred": 1, "s8": 1, "u8": 1}


def build(spec_path: str, mesh_arg: str):
    c = compile_file(spec_path, mesh_arg)
    plan = c.plan
    axes = plan.mesh.axes
    devices = np.array(jax.devices()[: plan.mesh.devices]).reshape(plan.mesh.shape or (1,))
    mesh = Mesh(devices, axes or ("data",))
    graph = plan.graph
    tr = plan.spec.training
    cdt = DT[tr.precision.compute]
    rules = plan.rules.table
    batch = tuple(plan.batch_axes)

    def pspec(spec):
        return P(*[(d if len(d) > 1 else d[0]) if d else None for d in spec])

    def act_spec(t):
        dims = [batch or None]
        for a in t.axes:
            m = tuple(x for x in rules.get(a, ()) if plan.mesh.sizes.get(x, 1) > 1 and x not in batch) if a else ()
            dims.append(m if len(m) > 1 else (m[0] if m else None))
        return P(*dims)

    def constrain(x, t):
        if mesh.size == 1:
            return x
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, act_spec(t)))

    param_sh = {p.name: NamedSharding(mesh, pspec(p.spec)) for p in plan.params}
    input_sh = {i.input.name: NamedSharding(mesh, pspec(i.spec)) for i in plan.inputs}

    def op(node, prefix, xs, params):
        a = node.attrs

        def w(name):
            return params[f"{prefix}{node.name}.{name}"].astype(cdt)

        def parts(name):  # shards of the output features over the tensor-parallel (non-batch) axes
            spec = plan.param(f"{prefix}{node.name}.{name}").spec[-1]
            return plan.mesh.degree(tuple(ax for ax in spec if ax not in plan.batch_axes))

        def together(x, ws, n):
            """Megatron's fused input projection: one matmul over the weights viewed shard by shard."""
            y = jnp.einsum("bsd,dpn->bspn", x, jnp.concatenate([m.reshape(m.shape[0], n, -1) for m in ws], -1))
            sizes = [m.shape[1] // n for m in ws]
            return [y[..., sum(sizes[:i]):sum(sizes[: i + 1])].reshape(*x.shape[:2], -1) for i in range(len(ws))]

        x = xs[0]
        k = node.op
        if k == "linear":
            y = x @ (params[a["tie"]].astype(cdt).T if a["tie"] else w("weight"))
            return y + w("bias") if a["bias"] else y
        if k == "relu":
            return jax.nn.relu(x)
        if k == "gelu":
            return jax.nn.gelu(x, approximate=a["approximate"] == "tanh")
        if k == "silu":
            return jax.nn.silu(x)
        if k == "tanh":
            return jnp.tanh(x)
        if k == "sigmoid":
            return jax.nn.sigmoid(x)
        if k == "softmax":
            return jax.nn.softmax(x, axis=-1)
        if k == "dropout":
            return x  # truth specs use rate 0 semantics: no rng in this step
        if k == "add":
            return sum(xs[1:], xs[0])
        if k == "mul":
            return math.prod(xs[1:], start=xs[0])
        if k in ("flatten", "reshape"):
            return x.reshape((x.shape[0],) + tuple(node.out.shape))
        if k == "layer_norm":
            mu = x.mean(-1, keepdims=True)
            var = ((x - mu) ** 2).mean(-1, keepdims=True)
            y = (x - mu) * jax.lax.rsqrt(var + a["eps"]) * w("weight")
            return y + w("bias") if a["bias"] else y
        if k == "rms_norm":
            return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + a["eps"]) * w("weight")
        if k == "embedding":
            return jnp.take(w("weight"), x, axis=0)
        if k == "pos_embedding":
            return x + w("weight")[: x.shape[1]]
        if k == "mlp":
            if a["activation"] == "swiglu":
                gate, up = together(x, [w("gate.weight"), w("up.weight")], parts("gate.weight"))
                return (jax.nn.silu(gate) * up) @ w("down.weight")
            h = x @ w("fc.weight") + (w("fc.bias") if a["bias"] else 0)
            h = {"gelu": lambda v: jax.nn.gelu(v, approximate=True), "relu": jax.nn.relu,
                 "silu": jax.nn.silu}[a["activation"]](h)
            return h @ w("proj.weight") + (w("proj.bias") if a["bias"] else 0)
        if k == "attention":
            b, s, _ = x.shape
            h, kv, hd = a["heads"], a["kv_heads"], a["head_dim"]
            q, kk, v = together(x, [w("q.weight"), w("k.weight"), w("v.weight")], parts("q.weight"))
            q, kk, v = q.reshape(b, s, h, hd), kk.reshape(b, s, kv, hd), v.reshape(b, s, kv, hd)
            if kv != h:
                kk = jnp.repeat(kk, h // kv, axis=2)
                v = jnp.repeat(v, h // kv, axis=2)
            sc = jnp.einsum("bqhd,bkhd->bhqk", q, kk) / math.sqrt(hd)
            if a["causal"]:
                sc = jnp.where(jnp.tril(jnp.ones((s, s), bool)), sc, -1e9)
            o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(sc, axis=-1), v).reshape(b, s, h * hd)
            return o @ w("o.weight")
        raise NotImplementedError(k)

    def scope(nodes, env, prefix, params):
        for n in nodes:
            xs = [env[i] for i in n.inputs]
            if isinstance(n, RepeatNode):
                y = xs[0]
                for i in range(n.count):
                    y = scope(n.layers, {"block_input": y}, f"{n.name}.{i}.", params)[n.layers[-1].name]
            else:
                y = constrain(op(n, prefix, xs, params), n.out)
            env[n.name] = y
        return env

    def loss_fn(params, inputs):
        env = {k: (v.astype(cdt) if jnp.issubdtype(v.dtype, jnp.floating) else v) for k, v in inputs.items()}
        env = scope(graph.layers, env, "", params)
        pred = env[graph.loss.prediction].astype(jnp.float32)
        tgt = env[graph.loss.targets]
        if graph.loss.op == "cross_entropy":
            logz = jax.nn.logsumexp(pred, axis=-1)
            picked = jnp.take_along_axis(pred, tgt[..., None], axis=-1)[..., 0]
            return jnp.mean(logz - picked)
        return jnp.mean((pred - tgt.astype(jnp.float32)) ** 2)

    o = tr.optimizer
    if o.name == "adamw":
        tx = optax.adamw(o.lr, b1=o.betas[0], b2=o.betas[1], eps=o.eps, weight_decay=o.weight_decay)
    elif o.name == "adam":
        tx = optax.adam(o.lr, b1=o.betas[0], b2=o.betas[1], eps=o.eps)
    else:
        tx = optax.sgd(o.lr, momentum=o.momentum or None)

    def step(params, opt_state, inputs):
        loss, grads = jax.value_and_grad(loss_fn)(params, inputs)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    pdt = DT[tr.precision.params]
    param_shapes = {p.name: jax.ShapeDtypeStruct(p.param.shape, pdt) for p in plan.params}
    init_params = jax.jit(lambda: {k: jnp.zeros(v.shape, v.dtype) for k, v in param_shapes.items()},
                          out_shardings=param_sh)
    params = init_params()
    opt_shapes = jax.eval_shape(tx.init, params)
    opt_sh = optax.tree_map_params(tx, lambda _, sh: sh, opt_shapes, param_sh,
                                   transform_non_params=lambda _: NamedSharding(mesh, P()))
    opt_state = jax.jit(tx.init, out_shardings=opt_sh)(params)
    micro = plan.micro_batch
    inputs = {i.input.name: jax.ShapeDtypeStruct((micro,) + i.input.type.shape, DT[i.input.type.dtype])
              for i in plan.inputs}
    jitted = jax.jit(step, in_shardings=(param_sh, opt_sh, input_sh),
                     out_shardings=(param_sh, opt_sh, NamedSharding(mesh, P())), donate_argnums=(0, 1))
    compiled = jitted.lower(params, opt_state, inputs).compile()
    return plan, mesh, compiled, params, opt_state


# ---------------------------------------------------------------- reading the compiled HLO


def _shape_bytes(text: str) -> int:
    total = 0
    for dt, dims in re.findall(r"\b(f32|bf16|f16|s32|u32|s64|pred|s8|u8)\[([0-9,]*)\]", text):
        n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        total += n * BYTES[dt]
    return total


def _groups(attr: str, n_devices: int) -> frozenset:
    attr = attr.strip()
    if attr.startswith("{"):
        groups = re.findall(r"\{([0-9,\s]*)\}", attr)
        return frozenset(frozenset(int(x) for x in g.split(",") if x.strip()) for g in groups if g.strip())
    m = re.match(r"mesh\[(.*?)\]\s*\{(.*?)\}", attr)
    if m:
        sizes = [(k, int(v)) for k, v in re.findall(r"'([^']+)'=(\d+)", m.group(1))]
        over = set(re.findall(r"'([^']+)'", m.group(2)))
        ids = np.arange(n_devices).reshape([s for _, s in sizes])
        return _partition(ids, [i for i, (k, _) in enumerate(sizes) if k in over])
    m = re.match(r"\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", attr)
    if m:
        out_shape = [int(x) for x in m.group(1).split(",")]
        ids = np.arange(n_devices).reshape([int(x) for x in m.group(2).split(",")])
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(",")])
        ids = ids.reshape(out_shape)
        return frozenset(frozenset(int(x) for x in row) for row in ids.reshape(out_shape[0], -1))
    raise ValueError(f"unreadable replica groups: {attr}")


def _partition(ids: np.ndarray, over: list[int]) -> frozenset:
    keep = [i for i in range(ids.ndim) if i not in over]
    moved = ids.transpose(keep + over).reshape(-1 if keep else 1, math.prod(ids.shape[i] for i in over) or 1)
    return frozenset(frozenset(int(x) for x in row) for row in moved)


def axes_of(groups: frozenset, mesh: Mesh) -> tuple[str, ...]:
    ids = np.vectorize(lambda d: d.id)(mesh.devices)
    names = list(mesh.axis_names)
    for r in range(len(names) + 1):
        for combo in itertools.combinations(range(len(names)), r):
            if _partition(ids, list(combo)) == groups:
                return tuple(names[i] for i in combo)
    return ("?",)


_COLL = re.compile(r"=\s*(.*?)\s+(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\((.*)")


def collectives(compiled, mesh: Mesh) -> list[dict]:
    out = []
    for line in compiled.as_text().splitlines():
        m = _COLL.search(line)
        if not m:
            continue
        result, kind, rest = m.groups()
        g = re.search(r"replica_groups=(\{\{.*?\}\}|mesh\[.*?\]\s*\{.*?\}|\[[0-9,]+\]<=\[[0-9,]+\](?:T\([0-9,]+\))?)",
                      rest)
        groups = _groups(g.group(1), mesh.size) if g else frozenset([frozenset(range(mesh.size))])
        axes = axes_of(groups, mesh)
        nbytes = _shape_bytes(result)
        n = len(next(iter(groups)))
        if kind == "reduce-scatter":
            nbytes *= n  # payload: the full buffer before scattering
        out.append({"kind": kind, "axes": list(axes), "bytes": nbytes, "group": n})
    return out


def measure(spec: str, mesh_arg: str) -> dict:
    plan, mesh, compiled, params, opt_state = build(spec, mesh_arg)
    mem = compiled.memory_analysis()

    def shard_bytes(tree):
        return int(sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree) if hasattr(x, "shape")
                       and x.ndim > 0))

    return {
        "spec": spec,
        "mesh": mesh_arg,
        "collectives": collectives(compiled, mesh),
        "memory": {k: getattr(mem, k) for k in ("argument_size_in_bytes", "output_size_in_bytes",
                                                 "temp_size_in_bytes", "alias_size_in_bytes")} if mem else None,
        "param_shard_bytes": shard_bytes(params),
        "optimizer_shard_bytes": shard_bytes(opt_state),
    }


def main() -> None:
    """python tests/jax_truth_step.py OUT.json SPEC MESH [SPEC MESH ...]"""
    out_path, *pairs = sys.argv[1:]
    results = [measure(spec, mesh) for spec, mesh in zip(pairs[::2], pairs[1::2])]
    Path(out_path).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
