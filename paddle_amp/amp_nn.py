"""``paddle.static.amp.amp_nn``: the native op builders, re-exported.

``check_finite_and_unscale`` and ``update_loss_scaling`` append Paddle's own
ops; they are pure graph builders. ``paddle_amp.decorate`` does not use
``update_loss_scaling``: its scale moves are the core's state machine
(``DynamicLossScale.from_paddle`` is the same rule, tested against this op).
"""
from paddle.static.amp.amp_nn import check_finite_and_unscale, update_loss_scaling  # noqa: F401
