"""The JAX programs' own helpers: framework code that no spec changes, the same in every JAX build."""
