"""The legacy program IR (Paddle 2.6; Paddle 3 with ``FLAGS_enable_pir_api=0``)."""
from .program import LegacyProgram, is_forward  # noqa: F401
