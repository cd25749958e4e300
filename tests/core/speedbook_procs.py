"""Processes for tests/core/test_speedbook.py (started by ``multiprocessing`` with "spawn", so
each is a fresh interpreter, as a data-parallel rank or a second program is): each makes its
own ``SpeedBook`` on a shared cache file."""
from pathlib import Path

from amp_adapters.rules.device import Cost, ShapeClass
from amp_adapters.services.speedbook import SpeedBook

MLP = ShapeClass.of([(64, 2048), (2048, 2048), (2048,)], result_rank=2)
HERE = {"cpu": "Test CPU", "flags": ["avx512_bf16", "avx512f"], "gpu": None, "isa": {}}


def rank_book(cache: str, calls: str, forward: float, refresh: bool = False) -> SpeedBook:
    """A book on ``cache`` whose timer answers ``forward`` (each rank its own: a rank that
    measured for itself would plan by its own number) and notes each call in ``calls``."""
    def measure(op, shape, training):
        with open(calls, "a") as f:
            f.write(f"{op} {forward}\n")
        return Cost(forward, 0.01)
    return SpeedBook("mxnet", "1.9.1", "bfloat16", measure, cache=Path(cache), here=HERE,
                     refresh=refresh)


def rank(cache: str, calls: str, forward: float, barrier, answers) -> None:
    """A rank: make the book, wait until every rank has made its own, then look the GEMM up
    and answer what it plans by."""
    book = rank_book(cache, calls, forward)
    barrier.wait()
    answers.put(book.lookup("FullyConnected", MLP).forward)


def refresh_one(cache: str, calls: str, forward: float) -> None:
    """Another process with ``AMP_ADAPTERS_REFRESH=1``: measures the GEMM again."""
    rank_book(cache, calls, forward, refresh=True).lookup("FullyConnected", MLP)
