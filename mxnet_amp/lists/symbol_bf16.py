"""``mxnet.contrib.amp.lists.symbol_bf16``: the native bfloat16 lists (from the core data,
``amp_adapters/rules/oplists/native.toml``; sorted, the native's own order is not kept)."""
from amp_adapters.rules.oplists import native_lists

_n = native_lists("mxnet", "bfloat16")
BF16_FUNCS = sorted(_n.lower)
BF16_FP32_FUNCS = sorted(_n.follow)
FP32_FUNCS = sorted(_n.fp32)
CONDITIONAL_FP32_FUNCS = [(op, attr, list(values)) for op, attr, values in _n.conditional_fp32]
WIDEST_TYPE_CASTS = sorted(_n.promote)
LOSS_OUTPUT_FUNCTIONS = list(_n.loss_output)
BF16_USE_FP32_PARAMS = {op: list(names) for op, names in _n.fp32_params.items()}
