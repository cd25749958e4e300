"""amp_adapters.rules: the policy kernel.

What decides precision, from data and the device truth: the policy, the op lists, the
planner, the device profile, the loss-scale rule. It imports no service (tests/core/
test_layering.py checks it). ``amp_adapters`` re-exports the names a user needs (``Policy``,
``OpLists``, ``plan_op`` and what its signature takes, the loss scales, the errors: its
``__all__``); the rest (``check_flag``, ``PolicyLike``, the op tables' loaders, the ISA
reading...) is the backends' and stays here, imported by its module path.

Files:

    policy.py     Policy: dtype, level, op-list overrides, loss scale, emulate; presets, files
    dtypes.py     the dtype vocabulary: names, low dtypes, aliases, widest-wins order
    oplists/      op lists as data (canonical vocabulary -> each framework's op names)
    planner.py    categorize / plan_op: the cast decision for one op (an OpCall)
    device.py     DeviceProfile: what a device runs low, on which route, and how fast
    isa.py        the device truth: machine() (CPU flags, CPUs, thread and ISA settings) and
                  what oneDNN uses for bf16 here: the flags capped by the ISA limit
    params.py     plan_params: which parameters O2 stores in the low dtype
    recompute.py  recasts: the casts a backward makes again rather than keeping their copies
    loss_scale/   the loss-scale rule, once: LossScaleConfig, LossScaleState, update over
                  the ArrayOps vocabulary (NumpyOps here), check_guard, strict state dicts
    scaler.py     DynamicLossScale / StaticLossScale / NoOpLossScale: config + state views
    policyfile.py reading and checking a policy file's structure (before anything is built)
    configcheck.py the one form of a config error; tables, unknown keys, lists of names
    toml_duplicates.py which key a policy file gives twice, and the line of each giving
    errors.py     the config and checkpoint errors
    layers.py     per-layer precision: op instances kept fp32 or run low, by name pattern
"""
