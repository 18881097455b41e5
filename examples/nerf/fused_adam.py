"""Keras Adam steps applied by one fused kernel per variable (``ResourceApplyAdam``) to gradients the caller has
already aggregated across replicas.

``keras.optimizers.Adam.apply_gradients`` all-reduces the gradients itself and runs its update as ~8 separate
element-wise ops per variable; the NeRF trainer aggregates them its own way (the hash table's gradient may be
computed from all-gathered per-sample gradients, see ``nerf.trainer``) and the table has millions of entries, so
it applies them here. The formula is Keras Adam's (``amsgrad=False``, no weight decay, clipping or EMA):
``m += (g - m)(1 - b1)``, ``v += (g^2 - v)(1 - b2)``, ``w -= lr sqrt(1 - b2^t) / (1 - b1^t) · m / (sqrt(v) + eps)``
with ``t`` the iteration count + 1; the optimiser's own variables hold the state (checkpoints are unchanged).
Runs in a replica context: each replica updates its own copies, with the same gradient everywhere.
"""

import keras
import tensorflow as tf


def _handle(variable):
    """The resource handle of a Keras or TF variable (this replica's copy under a tf.distribute strategy)."""
    return (variable.value if isinstance(variable, keras.Variable) else variable).handle


def apply(opt, grads, variables):
    """One Adam step of ``opt`` (a built ``keras.optimizers.Adam``) on ``variables`` with ``grads``."""
    if opt.amsgrad or opt.weight_decay or opt.clipnorm or opt.global_clipnorm or opt.clipvalue or opt.use_ema:
        raise ValueError("fused_adam.apply: only plain Adam (no amsgrad, weight decay, clipping or EMA)")
    t = tf.cast(opt.iterations + 1, tf.float32)
    b1, b2 = tf.constant(opt.beta_1, tf.float32), tf.constant(opt.beta_2, tf.float32)
    lr = tf.cast(opt.learning_rate, tf.float32)
    for g, var in zip(grads, variables):
        i = opt._get_variable_index(var)
        tf.raw_ops.ResourceApplyAdam(var=_handle(var), m=_handle(opt._momentums[i]), v=_handle(opt._velocities[i]),
                                     beta1_power=tf.pow(b1, t), beta2_power=tf.pow(b2, t), lr=lr, beta1=b1,
                                     beta2=b2, epsilon=tf.constant(opt.epsilon, tf.float32), grad=g)
    opt.iterations.assign_add(1)
