"""The hand-written op data: the mapping the generator reads, bf16 as differences only."""
import tomllib
from pathlib import Path

from amp_adapters.rules.oplists import _read, canonical_defaults, load_table

ROOT = Path(__file__).resolve().parents[2]
MAPPING = tomllib.loads((ROOT / "tools" / "op_mapping.toml").read_text("utf-8"))


def test_the_generated_tables_carry_the_hand_written_mapping():
    for framework in ("mxnet", "paddle"):
        generated = _read(f"{framework}.toml")
        for section in ("canonical", "conditional", "keep_fp32_inputs", "keep_fp32_outputs"):
            assert generated[section] == MAPPING[framework][section], (framework, section)
        table = load_table(framework)
        for canonical, names in MAPPING[framework]["canonical"].items():
            assert all(table.canonical(n) == canonical for n in names), canonical


def test_bfloat16_declares_only_what_differs_from_float16():
    declared = _read("canonical.toml")["bfloat16"]
    f16 = canonical_defaults("float16")
    for category, ops in declared.items():
        assert all(f16[op] != category for op in ops), category  # a difference, or nothing
    bf16 = canonical_defaults("bfloat16")
    assert set(bf16) == set(f16)
    moved = {op: cat for cat, ops in declared.items() for op in ops}
    assert {op: bf16[op] for op in bf16 if bf16[op] != f16[op]} == moved
