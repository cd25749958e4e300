"""PIR, Paddle 3's default program IR."""
from .program import PirProgram  # noqa: F401
