"""Paces the chaos drills' workers (`tests/test_chaos.py`): put this folder
first on a worker's PYTHONPATH and set SHARDSEARCH_DRILL_TRIAL_SECONDS, and
each trial the worker runs waits that long once it is asked, before its
candidate is proposed: a trial open (RUNNING, its owner's heartbeat on) that
long, as while a real model compiles.

mlp:tiny's search space is a few dozen programs, so the drills' workers
soon ran cache hits flat out, about two trials a second each: 1,064 trials
in the two minutes of the kill drill, and about 400 CPU seconds of the
workers in a 245-second run of the three drills alone, which the rest of
the suite waited for. A search of a real model spends seconds to minutes in
a trial; every paced trial still makes the same study writes.
"""

import os

_SECONDS = float(os.environ.get("SHARDSEARCH_DRILL_TRIAL_SECONDS") or 0)

if _SECONDS > 0:
    import time

    from shardsearch.search import loop as _loop

    _one = _loop._Runner._one

    def _paced(self, trial, baseline):
        time.sleep(_SECONDS)
        return _one(self, trial, baseline)

    _loop._Runner._one = _paced
