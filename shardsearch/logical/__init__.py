"""Logical axes: which dims of a step's arguments must be split alike.

`axes` holds the data (`LogicalAxes`: per leaf, a logical axis name per dim).
`discover` finds them from the step's own dataflow: `walk` visits the jaxpr
(calls, scan, while, cond), `primitives` holds one coupling rule per
primitive, `graph` keeps the (value, dim) graph whose connected components
are the axes, and `naming` gives them readable, stable names. The rules stage
maps logical axes onto mesh axes (`rules.logical.LogicalAxisRule`).
"""
