"""The native ``LossScaler``'s fields on ``trainer._amp_loss_scaler`` (and on ``LossScaler``).

MXNet toolkits read and write them directly (Sockeye sets ``_scale_seq_len`` after
``init_trainer`` and checkpoints ``_loss_scale``, ``_next_loss_scale``, ``_unskipped``).
``NativeScalerFields`` gives a class holding its loss scale in ``self.state`` (a
``LossScale``) those names as views of that one config and state:

- ``_loss_scale`` / ``_next_loss_scale``: the scale the next step uses (natively the
  second is a decision applied one step later; here a new scale is used by the very next
  step, so both read it; a write of either sets it);
- ``_unskipped``: clean steps since the scale last moved (``good_steps``);
- ``_scale_seq_len``: clean steps in a row before the scale grows (``growth_interval``);
- ``_max_loss_scale``: the growth ceiling (``max_scale``);
- ``loss_scale``: read-only, as natively.

A write replaces ``self.state`` (effective from the next ``scale_loss``: a step already
scaled is unscaled by the scale it was scaled with); the mapping and its invariants are the
core's ``loss_scale.mxnet_fields``, whose ``AmpConfigError`` a bad write raises. Any other
attribute the class does not set itself is refused with ``AttributeError`` naming the
fields, so a misspelt field is never silently accepted. No host sync.
"""
from __future__ import annotations

from typing import Any, ClassVar

from amp_adapters import LossScale, loss_scale_from_parts
from amp_adapters.rules.loss_scale import mxnet_fields


def _field(name: str) -> property:
    def get(self: "NativeScalerFields") -> Any:
        return mxnet_fields.read(self.state.config, self.state.state, name)
    get.__name__ = name
    get.__doc__ = f"The native LossScaler's ``{name}`` (see ``loss_scale.mxnet_fields``)."
    return property(get)


class NativeScalerFields:
    """Mixin: the native ``LossScaler``'s fields over ``self.state``; ``OWN`` names the
    attributes the class itself sets (anything else is refused)."""

    OWN: ClassVar[frozenset[str]] = frozenset()
    state: LossScale

    _loss_scale = _field("_loss_scale")
    _next_loss_scale = _field("_next_loss_scale")
    _unskipped = _field("_unskipped")
    _scale_seq_len = _field("_scale_seq_len")
    _max_loss_scale = _field("_max_loss_scale")

    @property
    def loss_scale(self) -> float:
        """The current scale (the native ``LossScaler.loss_scale``): the next step's."""
        return self.state.scale

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.OWN:
            object.__setattr__(self, name, value)
            return
        current = self.state
        config, state = mxnet_fields.write(current.config, current.state, name, value)
        if config != current.config or state != current.state:
            object.__setattr__(self, "state", loss_scale_from_parts(config, state))
