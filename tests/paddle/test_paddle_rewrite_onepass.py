"""The one-pass rewrite builds the same program, op for op, as the insert-at-a-time one.

The golden file was written by the rewrite this one replaced (casts inserted one by
one through ``Block._insert_op``, each syncing the whole block); every case is a
forward program rewritten under a policy and a device's kernels.
"""
import json

import pytest

paddle = pytest.importorskip("paddle")

import rewrite_models  # noqa: E402

pytestmark = pytest.mark.legacy_ir  # golden legacy programs; the PIR rewrite: test_paddle_pir_*


@pytest.fixture(scope="module")
def golden():
    with open(rewrite_models.GOLDEN) as f:
        return json.load(f)


@pytest.mark.parametrize("case", sorted(rewrite_models.CASES))
def test_same_program_op_for_op(case, golden, static):
    program, report = rewrite_models.rewritten(case)
    got = json.loads(json.dumps(rewrite_models.signature(program)))
    assert got == golden[case]
    assert any(op[0] == "cast" for block in got for op in block["ops"])  # casts were inserted
    assert report.decisions  # one decision per forward op
