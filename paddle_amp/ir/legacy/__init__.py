"""The legacy program IR (Paddle 2.6; Paddle 3 with ``FLAGS_enable_pir_api=0``)."""
from .program import LegacyProgram  # noqa: F401
from .values import is_forward  # noqa: F401
