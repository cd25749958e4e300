"""The memory bench's dygraph rows (bench/memory.py): ``auto`` runs where paddle_amp.dygraph
takes it and is a skipped row with the reason where it refuses it (dygraph ``auto`` is being
built); every other config runs. No measurement here."""
from amp_adapters.rules.errors import AmpConfigError
from bench import memory
from paddle_amp.dygraph import config


def test_the_auto_row_is_skipped_with_a_reason_when_dygraph_refuses_auto(monkeypatch):
    def refuses(**kw):
        raise AmpConfigError("policy='auto' is not built in dygraph")
    monkeypatch.setattr(config, "policy_of", refuses)
    got = memory.dygraph_refusal("auto")
    assert got.startswith("skipped: policy='auto' is refused in dygraph today")
    assert memory.dygraph_refusal("O1-bf16") is None

