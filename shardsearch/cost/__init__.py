"""The cost of a compiled program, without running it.

`hlo_graph` reads HLO text into computations and their trip counts, `hlo`
finds the collectives and the loop-aware matmul flops and bytes, `program`
gathers everything once into a `ProgramCost`, and `hardware` turns a
`ProgramCost` into seconds (`HardwareModel.estimate`). The static objective
of the search is built on it.
"""
