"""Memory: where graphs' memory comes from and who may overwrite it.

Backing allocators (:mod:`.backing`) give segments to graph memory pools (:mod:`.pool`), whose
blocks are kept by :mod:`.blocks`; :mod:`.replay_order` and :mod:`.overwrites` say which
replay may overwrite which graph's memory, and :mod:`.pool_summary` sums the pools per device.
"""
