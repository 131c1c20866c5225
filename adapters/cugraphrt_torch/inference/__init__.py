"""``graph_module``: a module's inference forward as one replayed graph (``module``), or one per
shape bucket (``bucketed``). Built on :mod:`..capture`."""
