"""Where candidates run: in this process, in a supervised worker process, or in
lockstep across JAX processes.

`isolate` + `worker` + `transport` (the isolated worker), `distributed` +
`lockstep` + `watchdog` (one mesh over several processes). Never imports
`search.study`.
"""
