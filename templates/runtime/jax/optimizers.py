"""The optimizer pieces of a JAX program that no spec changes (docs/program.md "Numerics"): the documented
learning-rate schedules and torch-style gradient clipping, as optax pieces; the optimizer state's layout
found from its parameters'. The program passes its settings."""

import jax
import jax.numpy as jnp
import optax


def schedule(kind, lr, warmup_steps, steps, min_lr_ratio=0.0):
    """The learning rate at 0-based step t of the schedule `kind` (noam, cosine, else constant after the
    warmup) over `steps` steps. Written out rather than composed from optax's schedules: optax's linear
    warmup starts at 0 where the documented one starts at lr / warmup_steps."""

    def lr_schedule(t):
        t = jnp.asarray(t, jnp.float32)
        if kind == "noam":
            w = max(warmup_steps, 1)  # noam needs warmup; 0 would give lr 0 forever
            return lr * jnp.minimum((t + 1) ** -0.5, (t + 1) * w**-1.5) * w**0.5
        if kind == "cosine":  # lr * min_lr_ratio after `steps`
            progress = jnp.minimum(1.0, (t - warmup_steps) / max(1, steps - warmup_steps))
            after = lr * (
                min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + jnp.cos(jnp.pi * progress))
            )
        else:
            after = jnp.float32(lr)
        return jnp.where(t < warmup_steps, lr * (t + 1) / max(warmup_steps, 1), after)

    return lr_schedule


def clip_by_global_norm(max_norm):
    """Scales every gradient by min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_ does
    (optax.clip_by_global_norm divides by the norm without the 1e-6)."""

    def update(updates, state, params=None):
        del params
        scale = jnp.minimum(1.0, max_norm / (optax.global_norm(updates) + 1e-6))
        return jax.tree.map(lambda g: (g * scale).astype(g.dtype), updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def shardings_by_param(init, abstract_params, param_shardings, replicated):
    """The shardings of the optimizer state init(params) (abstract_params: their shapes): each tensor found
    under a parameter's name takes that parameter's sharding (of `param_shardings`), the rest (step
    counters) is `replicated`. Placing them explicitly also keeps optax's scalar counters off a single
    device, which jit would reject."""

    def pick(path, leaf):
        for key in reversed(path):
            name = getattr(key, "key", None)
            if name in param_shardings and leaf.shape == abstract_params[name].shape:
                return param_shardings[name]
        return replicated

    return jax.tree_util.tree_map_with_path(pick, jax.eval_shape(init, abstract_params))
