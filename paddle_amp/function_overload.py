"""``paddle.static.amp.function_overload``: the native overload helper, re-exported."""
from paddle.static.amp.function_overload import (Function, FunctionType, Namespace,  # noqa: F401
                                                 overload)
