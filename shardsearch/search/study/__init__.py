"""The study's bookkeeping: what is stored, and who owns what.

`storage` (opening a study, the sampler, the compile cache), `identity` (what a
study searched), `ownership` (heartbeats, stale trials, claimed baselines),
`claims` (workers sharing a study), `record` (a trial as stored), `pruner`
(when a timed trial is slower than the best). Never imports
`search.execution`.
"""
