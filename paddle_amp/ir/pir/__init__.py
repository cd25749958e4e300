"""PIR, Paddle 3's default program IR."""
from .guard import watch_native_guards
from .program import PirProgram  # noqa: F401

watch_native_guards()  # the native fp16_guard's scope records its ops under PIR
