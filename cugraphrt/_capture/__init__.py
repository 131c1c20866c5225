"""Capture and replay: streams under capture, the Graph, and its launch.

:mod:`.stream_capture` keeps the captures underway (and routes CuPy's allocations to their
pool); :mod:`.graphs` holds :class:`~cugraphrt.Graph`, :mod:`.graph_context` the ``with
cugraphrt.graph(g):`` block, :mod:`.stream` CuPy's capture API by name, :mod:`.launcher` the
launch as one C-level call, :mod:`.graph_handles` what a Graph owns and :mod:`.diagnose` why
a capture failed.
"""
