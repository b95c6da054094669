"""Look inside gpt_train's step: what remat saves, that bf16 compute really is bf16, and
which collectives the 2x2x2 mesh compiles to. python prototypes/jax/inspect_step.py"""
import collections
import io
import re
import contextlib
import jax
import jax.ad_checkpoint
jax.config.update("jax_num_cpu_devices", 8)
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import gpt_train as g

mesh = jax.make_mesh((2, 2, 2), g.MESH_AXES, axis_types=(AxisType.Auto,) * 3)
t = g.param_table()
sh = g.make_param_shardings(mesh, t)
params = g.init_params(t, sh, 0, jnp.float32)
resid = NamedSharding(mesh, P(("data", "fsdp"), None, None))
batch = {"tokens": jnp.zeros((16, 64), jnp.int32), "targets": jnp.zeros((16, 64), jnp.int32)}

for remat in ["none", "selective", "full"]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        jax.ad_checkpoint.print_saved_residuals(
            lambda p: g.loss_fn(p, batch, g.MODEL, jnp.float32, remat, resid), params)
    lines = [l for l in buf.getvalue().splitlines() if l.strip()]
    nbytes = 0
    for l in lines:
        m = re.match(r"(\w+)\[([\d,]*)\]", l.strip())
        if m:
            n = 1
            for d in filter(None, m.group(2).split(",")):
                n *= int(d)
            nbytes += n * {"f32": 4, "bf16": 2, "s32": 4, "i32": 4, "bool": 1, "pred": 1}.get(m.group(1), 4)
    print(f"remat={remat:9s} saved residuals: {len(lines):3d} arrays, {nbytes / 2**20:.2f} MiB (global, incl. params)")

jaxpr = jax.make_jaxpr(lambda p: g.loss_fn(p, batch, g.MODEL, jnp.bfloat16, "none", resid))(params)
dots = collections.Counter(str(e.outvars[0].aval.dtype) for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general")
print("bf16 compute: dot_general output dtypes", dict(dots))

opt = g.make_optimizer(g.TRAIN, {n: jax.ShapeDtypeStruct(p.shape, p.dtype) for n, p in params.items()}, 20)
osh = g.opt_state_shardings(opt, params, sh, mesh)
state = jax.jit(opt.init, out_shardings=osh)(params)
bsh = {k: NamedSharding(mesh, P(None, ("data", "fsdp"))) for k in batch}
step = jax.jit(g.make_train_step(opt, g.make_schedule(g.TRAIN, 20), g.MODEL, 1, jnp.float32, "none", resid),
               in_shardings=(sh, osh, bsh), out_shardings=(sh, osh, NamedSharding(mesh, P())))
compiled = step.lower(params, state, {k: v[None] for k, v in batch.items()}).compile()
hlo = compiled.as_text()
ops = collections.Counter(re.findall(r"= \S+ (all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all)(?:-start)?\(", hlo))
print("collectives in the 2x2x2 step:", dict(ops))
ma = compiled.memory_analysis()
print(f"memory_analysis per device: args {ma.argument_size_in_bytes} out {ma.output_size_in_bytes} "
      f"alias {ma.alias_size_in_bytes} temp {ma.temp_size_in_bytes}")
