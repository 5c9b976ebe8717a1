"""The base layer: helpers every stage uses, and the pieces a user calls directly.

`units` (byte sizes), `tree` (leaf paths and shapes), `spec` (canonical
PartitionSpecs and their JSON form), `mesh` (building and finding meshes),
`analyzer` (checking spec trees and counting bytes per device) and `monitor`
(the monitored step and the barrier). Nothing here imports another stage.
"""
