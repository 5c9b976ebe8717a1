"""A workload whose step fails while running, in JAX process 1 only.

For `tests/test_distributed.py`: an error in one process of a multi-process
search between two of a candidate's steps, the others already inside the
next step's collectives. The workload is mlp:tiny; building it in process 1
with `SHARDSEARCH_TEST_FAIL_FROM=N` set makes that process's finiteness
check raise from its N-th call on, as when NaN shows in its shards only.
"""

import itertools
import os

import jax

from shardsearch.search.evaluation import evaluate
from shardsearch.workloads import get_workload


def failing_in_process_1():
    fail_from = int(os.environ.get("SHARDSEARCH_TEST_FAIL_FROM") or 0)
    if fail_from and jax.process_index() == 1:
        calls = itertools.count(1)
        check = evaluate.check_finite

        def failing_check(result, when, state=False):
            if next(calls) >= fail_from:
                raise evaluate.NonFinite(f"injected: metrics['loss'] is nan {when}")
            check(result, when, state)

        evaluate.check_finite = failing_check
    return get_workload("mlp:tiny")
