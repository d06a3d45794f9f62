"""Training steps to trace: ``value_and_grad`` plus an SGD or Adam update."""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["train_step", "init_opt_state", "OptimizerStateError", "OPTIMIZERS"]

OPTIMIZERS = ("sgd", "adam")

# Adam defaults from Kingma & Ba 2015, "Adam: A Method for Stochastic Optimization", Algorithm 1.
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-8


class OptimizerStateError(ValueError):
    """The ``opt_state`` given to a :func:`train_step` step is not the one its optimizer keeps."""


def init_opt_state(optimizer: str, params: Any) -> Any:
    """Optimizer state for ``params`` (arrays or ``jax.ShapeDtypeStruct`` s).

    SGD has none (``()``); Adam keeps two float32 moments per parameter and an
    int32 step count: ``{"mu": ..., "nu": ..., "count": ...}``.
    """
    import jax
    import jax.numpy as jnp

    _check(optimizer)
    if optimizer == "sgd":
        return ()
    abstract = any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(params))
    if abstract:
        moment = lambda p: jax.ShapeDtypeStruct(p.shape, jnp.float32)  # noqa: E731
        count = jax.ShapeDtypeStruct((), jnp.int32)
    else:
        moment = lambda p: jnp.zeros(p.shape, jnp.float32)  # noqa: E731
        count = jnp.zeros((), jnp.int32)
    return {"mu": jax.tree_util.tree_map(moment, params),
            "nu": jax.tree_util.tree_map(moment, params), "count": count}


def train_step(loss_fn: Callable[[Any, Any], Any], optimizer: str = "sgd",
               learning_rate: float = 1e-3) -> Callable[[Any, Any, Any], tuple[Any, Any, Any]]:
    """``(params, opt_state, batch) -> (params, opt_state, loss)`` built on ``jax.value_and_grad``.

    Example::

        step = train_step(lambda p, b: ((b["x"] @ p["w"]) ** 2).sum(), "adam", 1e-3)
        graph = autolayout.trace(step, params, init_opt_state("adam", params), batch,
                                 dims=(..., None, ...), roles=("param", "opt_state", "input"))
    """
    import jax
    import jax.numpy as jnp

    _check(optimizer)

    def step(params: Any, opt_state: Any, batch: Any) -> tuple[Any, Any, Any]:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        grads = label_grads(grads)
        if optimizer == "sgd":
            new = jax.tree_util.tree_map(lambda p, g: p - learning_rate * g.astype(p.dtype), params, grads)
            return new, opt_state, loss
        _check_adam_state(opt_state, params)
        count = opt_state["count"] + 1
        t = count.astype(jnp.float32)
        mu = jax.tree_util.tree_map(lambda m, g: ADAM_B1 * m + (1 - ADAM_B1) * g.astype(jnp.float32),
                                    opt_state["mu"], grads)
        nu = jax.tree_util.tree_map(
            lambda v, g: ADAM_B2 * v + (1 - ADAM_B2) * jnp.square(g.astype(jnp.float32)),
            opt_state["nu"], grads)
        c1 = 1 - ADAM_B1 ** t
        c2 = 1 - ADAM_B2 ** t

        def update(p: Any, m: Any, v: Any) -> Any:
            u = (m / c1) / (jnp.sqrt(v / c2) + ADAM_EPS)
            return (p.astype(jnp.float32) - learning_rate * u).astype(p.dtype)

        new = jax.tree_util.tree_map(update, params, mu, nu)
        return new, {"mu": mu, "nu": nu, "count": count}, loss

    step.__name__ = f"train_step_{optimizer}"
    return step


def label_grads(grads: Any) -> Any:
    """Name each gradient ``grad/<param path>`` so graphs and reports read well. Nothing
    depends on the names: the tracer pairs gradients with parameters by structure
    (``graph.param_roles``)."""
    import jax

    from autolayout.trace import _path_str, named

    return jax.tree_util.tree_map_with_path(lambda path, g: named(g, name="grad/" + _path_str(path)),
                                            grads)


def _check_adam_state(opt_state: Any, params: Any) -> None:
    """Adam's state must be ``{"mu": <params' tree>, "nu": <params' tree>, "count": scalar}``."""
    import jax

    fix = 'make it with autolayout.init_opt_state("adam", params)'
    if not isinstance(opt_state, dict) or set(opt_state) != {"mu", "nu", "count"}:
        got = (f"a dict with keys {sorted(map(str, opt_state))}" if isinstance(opt_state, dict)
               else "() (SGD's state)" if isinstance(opt_state, tuple) and not opt_state else type(opt_state).__name__)
        raise OptimizerStateError(f'train_step(..., "adam"): opt_state is {got}; Adam\'s state is '
                                  f'{{"mu": <like params>, "nu": <like params>, "count": int32 scalar}}: {fix}')
    want = jax.tree_util.tree_structure(params)
    for key in ("mu", "nu"):
        got = jax.tree_util.tree_structure(opt_state[key])
        if got != want:
            raise OptimizerStateError(f'train_step(..., "adam"): opt_state["{key}"] has structure {got}, not the '
                                      f"parameters' {want}; {fix}")
    if getattr(opt_state["count"], "shape", None) != ():
        raise OptimizerStateError(f'train_step(..., "adam"): opt_state["count"] must be a scalar step count, got '
                                  f"{type(opt_state['count']).__name__} of shape "
                                  f"{getattr(opt_state['count'], 'shape', None)}; {fix}")


def _check(optimizer: str) -> None:
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {OPTIMIZERS}")
