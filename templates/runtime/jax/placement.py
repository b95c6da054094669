"""The train state of a JAX program laid out on the mesh from host values: each process computes (or reads)
only the slices its devices hold, from lazy tensors by canonical name (runtime/params.py, param_files.py),
and a stacked parameter's rows from its copies; the restore targets of a checkpoint."""

import jax
import jax.numpy as jnp
import numpy as np

from runtime.jax.checkpoints import to_host


def stack_of(name):
    """A name of the train state -> (repeat, name inside the block) for a block parameter (or buffer) stacked
    over the block's copies, "<repeat>.*.<param>"; (None, name) for the others."""
    repeat, stacked, local = name.partition(".*.")
    return (repeat, local) if stacked else (None, name)


def place_array(src, name, shape, sharding, dtype, rows=None):
    """The train state's `name` as a global jax.Array laid out by `sharding`, from `src`: lazy tensors (or
    arrays) by canonical name, indexed by slices. `rows`: of a stacked parameter, the canonical name of the
    copy each row holds (None: a padding row, zeros, which it keeps: its gradients are zero). Each process
    computes or reads only the slices of its own devices, once each (of a stacked parameter: its copies'
    slices, stacked), so no process ever holds a whole parameter it does not own, and the same call serves
    one process and many."""
    dtype = jnp.dtype(dtype)
    done = {}

    def shard(index):
        at = tuple((s.start, s.stop) for s in index)
        if at not in done:
            if rows is None:
                done[at] = np.asarray(src[name][index]).astype(dtype)
            else:  # rows index[0]: those copies, each sliced by the rest of the index
                held = [
                    np.asarray(src[n][index[1:]])
                    if n is not None
                    else np.zeros(shape[1:], dtype)[index[1:]]
                    for n in rows[index[0]]
                ]
                done[at] = np.stack(held).astype(dtype)
        return done[at]

    return jax.make_array_from_callback(tuple(shape), sharding, shard)


def restore_targets(abstract, shardings, leave_out=()):
    """The targets of a restore: the train state's shapes and dtypes (`abstract`) with their `shardings`,
    less the parts `leave_out` (not checkpointed)."""
    kept = [k for k in abstract if k not in leave_out]
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        {k: abstract[k] for k in kept},
        {k: shardings[k] for k in kept},
    )


def initial_state(src, buffers, abstract, shardings, place, init_optimizer, param_dtype):
    """The train state at step 0 of the shapes `abstract`, laid out by `shardings`: the parameters from `src`
    and the buffers (float32) from `buffers` (lazy tensors by canonical name), each placed by place(src,
    name, shape, sharding, dtype); a fresh optimizer state init_optimizer(params); step 0."""
    params = {
        name: place(src, name, a.shape, shardings["params"][name], param_dtype)
        for name, a in abstract["params"].items()
    }
    init_opt = jax.jit(init_optimizer, out_shardings=shardings["opt_state"])
    return {
        "params": params,
        "opt_state": init_opt(params),
        "buffers": {
            name: place(buffers, name, a.shape, shardings["buffers"][name], np.float32)
            for name, a in abstract["buffers"].items()
        },
        "step": place({"step": np.zeros((), np.int32)}, "step", (), shardings["step"], np.int32),
    }


def gather_arrays(arrays, rows_of=None, names=None):
    """`arrays` (global, by the train state's names) gathered one at a time (to_host: a collective, every
    process calls it) -> numpy arrays by canonical name: a stacked one (rows_of(name): the canonical name of
    the copy each of its rows holds, None for a padding row) gives one per copy; in the order of `names`
    where given."""
    out = {}
    for name, w in arrays.items():
        host, rows = to_host(w), rows_of(name) if rows_of else None
        out.update({n: host[q] for q, n in enumerate(rows) if n} if rows else {name: host})
    return out if names is None else {name: out[name] for name in names}
