"""Graphed callables: a captured function called like the original.

:mod:`.call_path` is the one call path (copy in, settle the overwrite order, replay, hand
out) that every graphed callable runs, CuPy's and the adapters'; :mod:`.cupy_framework` is
CuPy's implementation of :class:`cugraphrt.adapter.Framework`; :mod:`.graphed` holds
:func:`cugraphrt.make_graphed`, and :mod:`.buckets` (with :mod:`.bucket_plan`) the shape
buckets any framework's callable can use.
"""
