"""``make_graphed_callables``: forward and backward graphs under autograd (``autograd``), their
argument and output plans (``_autograd_plan``), the call-time runtime (``_autograd_runtime``)
and the guard against handing out aliases a replay overwrites (``_autograd_guard``). Built on
:mod:`..capture`."""
