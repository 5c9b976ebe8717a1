"""Plan files: schema-1 JSON of rules, mesh and resolved specs.

`writer` builds and writes them (`plan_config`, `write_config`,
`partition_rules_source`); `reader` loads them back (`load_plan`,
`load_rule`) parsing JSON only. Plans sit below the search: a training script
that loads one needs none of the search's machinery, and the search's
`export` turns a study into one.
"""
