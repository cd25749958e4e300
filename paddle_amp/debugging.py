"""``paddle.static.amp.debugging``: operator statistics, re-exported (a pure graph utility).

``collect_operator_stats(program)`` prints how many ops of each type run in
each dtype; after ``decorate(...).minimize`` it shows paddle_amp's rewrite
(``paddle_amp.cast_report(program)`` also gives the reason for each op).
"""
from paddle.static.amp.debugging import OperatorStatsUnit, collect_operator_stats  # noqa: F401
