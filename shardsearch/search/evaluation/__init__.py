"""Judging one candidate: check, compile, then score.

`stages` (how an evaluation can end), `outcome` (`Outcome` and the
fingerprint), `context` (`Context`: what is fixed for a study), `evaluate`
(the per-candidate pipeline), `objectives` (what a compiled candidate is
worth), `confirm` (interleaved re-timing and the output check), `logs`
(XLA's log lines per candidate).
"""
