"""The core's rule for casts the backward makes again (``amp_adapters.rules.recompute``):
on any program, recasting never raises the bytes alive at any point of the step, and lowers
them where the source lives anyway; on the MLP shape that motivated it (issue 40), exactly
the copies of ReLU outputs are recast."""
from hypothesis import given, settings, strategies as st

from amp_adapters.rules.recompute import OpUse, Recast, recasts


def _live_bytes(ops, size, plan=()):
    """Bytes alive before each op runs, a value alive from its writer to its last reader (as
    a program's garbage collector frees it), with ``plan`` applied: each recast's result
    alive from its ``at`` to its last reader, the forward copy only up to its last forward
    reader, the source read by the recast at ``at``."""
    reads = [set(op.reads) for op in ops]
    extra = {}  # recast result -> (first, last position alive)
    for r in plan:
        src = ops[r.cast].cast[0]
        for j in r.readers:
            reads[j].discard(r.dst)
        reads[r.at].add(src)  # the recast, just before ``at``
        extra[("recast", r.cast)] = (r.at, r.readers[-1], size[r.dst])
    first, last = {}, {}
    for i, op in enumerate(ops):
        for v in op.writes:
            first.setdefault(v, i)
        for v in reads[i]:
            first.setdefault(v, 0)  # a feed or a parameter: alive from the start
            last[v] = i
    out = []
    for p in range(len(ops)):
        n = sum(size[v] for v in first if first[v] <= p <= last.get(v, first[v]))
        n += sum(b for a, z, b in extra.values() if a <= p <= z)
        out.append(n)
    return out


@st.composite
def programs(draw):
    """A forward of ops over values 0..n, some of them casts, then a backward reading any
    earlier value (in place writes too, and forward ops among it); sizes per value."""
    n_fwd = draw(st.integers(2, 8))
    ops, values = [], [0]
    for i in range(n_fwd):
        new = len(values)
        src = draw(st.sampled_from(values))
        if draw(st.booleans()):
            ops.append(OpUse(frozenset({src}), frozenset({new}), cast=(src, new)))
        else:
            ops.append(OpUse(frozenset(draw(st.sets(st.sampled_from(values), max_size=2))) |
                             {src}, frozenset({new})))
        values.append(new)
    for _ in range(draw(st.integers(1, 8))):
        reads = draw(st.sets(st.sampled_from(values), min_size=1, max_size=3))
        writes = {len(values)}
        if draw(st.integers(0, 5)) == 0:  # an in-place write of a forward value
            writes.add(draw(st.sampled_from(values)))
        values.append(len(values))
        # mostly the backward; now and then more forward after it (paddle.static.gradients
        # before the rest of the model is built)
        ops.append(OpUse(frozenset(reads), frozenset(writes),
                         backward=draw(st.integers(0, 4)) > 0))
    size = {v: draw(st.sampled_from([1, 2, 4])) for v in values}
    return ops, size


@settings(max_examples=300, deadline=None)
@given(programs())
def test_recasting_never_raises_the_bytes_alive_at_any_point(prog):
    ops, size = prog
    plan = recasts(ops)
    before, after = _live_bytes(ops, size), _live_bytes(ops, size, plan)
    assert all(a <= b for a, b in zip(after, before)), (plan, before, after)
    for r in plan:  # each recast reads a source alive there, for backward readers of the copy
        src, dst = ops[r.cast].cast
        assert not ops[r.cast].backward and r.dst == dst
        assert all(ops[j].backward and dst in ops[j].reads for j in r.readers)
        assert any(src in op.reads for op in ops[r.at:])
        if r.after is not None:  # what the recast waits for: written in the backward before
            assert r.after in ops[r.at].reads
            assert any(op.backward and r.after in op.writes for op in ops[r.cast:r.at])
        assert not any(src in op.writes or dst in op.writes
                       for op in ops[r.cast + 1:r.readers[-1] + 1])


def _mlp(layers=4):
    """x -> [cast -> gemm -> cast up -> add -> relu] x layers -> loss, and the backward in
    reverse: relu_grad reads the ReLU output, gemm_grad the low copy of the GEMM input.
    Values: ("x"), ("lo", i), ("mm", i), ("up", i), ("add", i), ("relu", i), grads ("g", i)."""
    fwd, bwd = [], []
    h = "x"
    for i in range(layers):
        fwd += [OpUse(frozenset({h}), frozenset({("lo", i)}), cast=(h, ("lo", i))),
                OpUse(frozenset({("lo", i), ("w", i)}), frozenset({("mm", i)})),
                OpUse(frozenset({("mm", i)}), frozenset({("up", i)}), cast=(("mm", i),
                                                                            ("up", i))),
                OpUse(frozenset({("up", i), ("b", i)}), frozenset({("add", i)})),
                OpUse(frozenset({("add", i)}), frozenset({("relu", i)}))]
        h = ("relu", i)
    for i in reversed(range(layers)):
        bwd += [OpUse(frozenset({("relu", i), ("g", i)}), frozenset({("ga", i)}), True),
                OpUse(frozenset({("lo", i), ("w", i), ("ga", i)}), frozenset({("g", i - 1)}),
                      True)]
    return fwd + bwd


def test_on_an_mlp_exactly_the_copies_of_relu_outputs_are_recast():
    ops = _mlp()
    plan = recasts(ops)
    # layer 0's input x is read by nothing after its cast: its copy is kept; each ReLU
    # output is read by its gradient after the copy's gradient reader: recast there
    assert [ops[r.cast].cast[0] for r in plan] == [("relu", 0), ("relu", 1), ("relu", 2)]
    assert all(isinstance(r, Recast) and len(r.readers) == 1 for r in plan)
    # each waits for the gradient its GEMM's gradient op reads (relu_grad's result)
    assert [r.after for r in plan] == [("ga", 1), ("ga", 2), ("ga", 3)]
    # the cast up of a GEMM result (read by no gradient op) is never recast
    assert not any(ops[r.cast].cast[0][0] == "mm" for r in plan)
