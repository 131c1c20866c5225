"""The ``torch.compile`` backend ``"cugraphrt"`` (``dynamo``): each compiled piece replayed as
cugraphrt graphs (``_aot_graph``, shape buckets in ``_aot_graph_buckets``), Inductor with eager's
numerics (``_eager_kernels``), and what the backend reads of an FX graph (``_fx_inspect``,
``_reinplace``). Built on :mod:`..capture`."""
