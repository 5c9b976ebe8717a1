"""The search space: what one trial may try.

`candidate` (`Candidate`: a state rule and a batch rule), `params` (parameter
blocks declared once for suggest and enumerate), `searchspace` (`SearchSpace`
and the rules family's blocks), `logical` (the logical family's blocks),
`baselines` (the warm-start candidates, start plans and `make_space`),
`differences` (`plan_differences`: what two plans differ in, by dimension).
"""
