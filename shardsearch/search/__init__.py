"""The search: propose candidates, evaluate each, record them, confirm the winner.

In pipeline order: `candidate` (what one trial tries), `params` and `space`
(Optuna parameters → a candidate), `stages` (how an evaluation can end),
`evaluate` (check, compile, score a candidate), `objectives` (what a
compiled candidate is worth), `confirm` (interleaved re-timing), `context`
(what is fixed for a study), `storage` (study storage, sampler, compile
cache), `identity` (what a study searched; a resumed run must match),
`ownership` (who runs a trial: heartbeats, stale trials, claimed baselines),
`record` (a trial as stored), `loop` (`optimize`), `finish` (the
winner), `result` (`OptimizeResult`), `export` (a study → a plan).
"""
