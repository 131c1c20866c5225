"""The ``torch.compile`` backend ``"cugraphrt"``: compiled code replayed as cugraphrt graphs.

``torch.compile(model, backend="cugraphrt")`` finds this backend through the
``torch_dynamo_backends`` entry point, so no import is needed. Dynamo hands the backend one
FX graph per region between graph breaks; AOTAutograd splits each into an inference graph, or
a forward and a backward graph; each of those is compiled (by Inductor, or by ``aot_eager``'s
FX interpreter) and becomes a :class:`~cugraphrt_torch.compile._aot_graph.AotGraph`, which captures
the compiled code into a cugraphrt graph and replays it. See ``docs/compile.md``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import Field

from cugraphrt.adapter import Frozen, resolve_buckets
from cugraphrt.errors import OptionsError
from cugraphrt.options import validate_options

from .._internals import compile as _compile
from . import _fx_inspect
from ._aot_graph import AotGraph, AotGraphReport, AotGraphSettings, live_aot_graphs
from ._aot_graph_buckets import AotGraphBuckets, plan_buckets
from ._eager_kernels import Numerics, compile_inductor
from ._host_prefix import HostPrefixed, split_host_prefix
from ._reinplace import reinplace_input_mutations

__all__ = ["CompileOptions", "backend", "compile_report", "format_compile_report"]


class CompileOptions(Frozen):
    """Options of the ``"cugraphrt"`` backend, given as ``torch.compile(options={...})``.

    Attributes
    ----------
    compiler : {"inductor", "aot_eager"}
        What compiles each graph: Inductor (fused Triton kernels), or AOTAutograd alone with
        the graph run op by op (``aot_eager``; quick to compile, useful to rule Inductor out).
    strict : bool
        Raise instead of falling back: :class:`cugraphrt.CaptureError` for a piece that
        cannot be captured, :class:`cugraphrt.ReplayError` past ``max_graphs`` or
        ``max_rerecords``.
    warmup : int
        Eager calls of each piece per input shape before it is captured (at least 1:
        compiled kernels load on their first run, which a capture forbids).
    max_graphs : int
        Recordings per piece, one per input shape of a dynamic graph; calls with further
        shapes run eagerly (with a warning).
    max_rerecords : int
        How often a piece is captured again because a static input (parameter, buffer,
        ``mark_static_address`` tensor) moved; after that it runs eagerly, with a warning
        that names the input.
    copy_outputs : bool
        Return copies of the outputs (the default: outputs stay valid like eager ones). With
        False, a piece returns the tensors its graph writes, which its next call overwrites.
    check_outputs : bool, optional
        With ``copy_outputs=False``: reading a piece's output after a later replay overwrote
        it raises a ``RuntimeError`` naming the piece and the call (docs/reliability.md).
        None (the default) means on unless the environment variable
        ``CUGRAPHRT_CHECK_OUTPUTS=0``.
    buckets : "pow2" or list of int, optional
        Shape buckets for inference pieces compiled with a dynamic size: a call of size
        ``n`` replays the graph of the smallest bucket ``>= n``, its copied inputs padded
        (see ``docs/compile.md``). Only for code whose rows do not interact (a batch in
        inference). Sizes above the largest bucket get a recording each, as without
        buckets. ``"pow2"``: 1, 2, 4, ... up to ``max_bucket``.
    max_bucket : int, optional
        The largest bucket of ``buckets="pow2"`` (required with it, refused without it).
    eager_numerics : bool or "exact"
        Inductor only. True: keep eager's rounding in low precision; fused bf16/fp16 kernels
        round every intermediate to the storage type where eager's separate kernels do
        (Inductor's ``emulate_precision_casts``, and eager's rounded division where the torch
        version has it). Reductions and math functions stay Inductor's, so a result can
        still differ from eager's in its last bit. ``"exact"``: also run eager's kernels for
        floating reductions, normalizations and math functions, fusing only what rounds as
        eager does: eager's bits, at the cost of the fusions given up; inference graphs
        only (a graph that trains raises OptionsError; docs/compile.md).
        ``aot_eager`` runs eager's kernels and needs no such setting.
    """

    compiler: Literal["inductor", "aot_eager"] = "inductor"
    strict: bool = False
    warmup: int = Field(default=1, ge=1)
    max_graphs: int = Field(default=8, ge=1)
    max_rerecords: int = Field(default=3, ge=0)
    copy_outputs: bool = True
    check_outputs: bool | None = None
    buckets: Literal["pow2"] | list[int] | None = None
    max_bucket: int | None = Field(default=None, ge=1)
    eager_numerics: Numerics = False


_region_ids = itertools.count()


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[object], *,
            options: dict | None = None, mode: str | None = None):
    """Compile one dynamo graph for ``torch.compile(backend="cugraphrt")``.

    Parameters
    ----------
    gm : torch.fx.GraphModule
        The region dynamo traced.
    example_inputs : sequence
        Its inputs (fake tensors and ints).
    options : dict, optional
        :class:`CompileOptions` fields.
    mode : str, optional
        Not supported (``torch.compile``'s modes are Inductor's); raises OptionsError.

    Returns
    -------
    callable
        What dynamo calls in place of the region.
    """
    if mode is not None:
        raise OptionsError("mode", mode, "the cugraphrt backend takes no mode; pass "
                                         "options={...} (see CompileOptions)")
    if options is not None and not isinstance(options, dict):
        raise OptionsError("options", options, "a dict of CompileOptions fields")
    opts = validate_options(CompileOptions, **(options or {}))
    settings = AotGraphSettings(warmup=opts.warmup, max_graphs=opts.max_graphs,
                             max_rerecords=opts.max_rerecords, copy_outputs=opts.copy_outputs,
                             strict=opts.strict, buckets=_bucket_sizes(opts),
                             check_outputs=opts.check_outputs)
    region = _DynamoGraph(next(_region_ids), opts.compiler, settings,
                     _fx_inspect.placeholder_names(gm))
    if opts.compiler == "aot_eager":
        return region.compile_aot_eager(gm, example_inputs)
    return region.compile_inductor(gm, example_inputs, opts.eager_numerics)


class _DynamoGraph:
    """The pieces of one dynamo graph: inference, or forward and backward."""

    def __init__(self, number: int, compiler: str, settings: AotGraphSettings,
                 dynamo_names: list[str]) -> None:
        self.number = number
        self.compiler = compiler
        self.settings = settings
        self.dynamo_names = dynamo_names
        # Inputs of the forward that stay in place: the backward's primals among them too.
        self.forward_static: frozenset[int] = frozenset()

    def compile_inductor(self, gm, example_inputs, numerics: Numerics):
        def finish(compiled, graph, inputs, kwargs):
            kind = ("backward" if kwargs.get("is_backward") else
                    "inference" if kwargs.get("is_inference") else "forward")
            return self.piece(compiled, graph, inputs, kind, kwargs.get("static_input_idxs"))

        # AOTAutograd's cache stores Inductor's output code; a AotGraph is not one.
        with _compile.no_autograd_cache():
            return compile_inductor(gm, example_inputs, numerics, finish)

    def compile_aot_eager(self, gm, example_inputs):
        def compiler(kind):
            def compile_graph(graph, inputs):
                if kind == "inference":  # where input mutations stay in the graph
                    reinplace_input_mutations(graph)
                    split = self._host_prefix(graph, inputs)
                    if split is not None:
                        return split
                return self.piece(_compile.make_boxed_func(graph.forward), graph, inputs,
                                  kind, None)
            return compile_graph

        aot = _compile.aot_autograd(fw_compiler=compiler("forward"),
                                    bw_compiler=compiler("backward"),
                                    inference_compiler=compiler("inference"),
                                    keep_inference_input_mutations=True)
        # Eager's kernels means eager's ops too: torch._decomp would otherwise trace
        # upsampling as a dozen pointwise ops that round differently (detection models in
        # pieces then kept other boxes than eager). Dynamo passes a symbolic size as a SymInt
        # input.
        symbolic = any(isinstance(value, torch.SymInt) for value in example_inputs)
        with _compile.no_autograd_cache(), _compile.eager_composites(symbolic):
            return aot(gm, example_inputs)

    def _host_prefix(self, graph, inputs) -> HostPrefixed | None:
        """An inference graph that computes on the host from its CPU inputs, its host work
        split off to run eagerly and the rest graphed (``_host_prefix``); None where the
        graph has no such work, or its device work cannot be graphed either."""
        names = self._names(graph, "inference")
        if _fx_inspect.uncapturable_reason(graph, inputs, names) is None:
            return None
        split = split_host_prefix(graph, inputs)
        if split is None:
            return None
        device_names = _fx_inspect.placeholder_names(split.device)
        if _fx_inspect.uncapturable_reason(split.device, split.example_inputs,
                                           device_names) is not None:
            return None
        inner = [names[i] for i in split.device_inputs] + list(split.copy_names)
        static = set(_forward_static(len(inputs)))
        inner_static = [j for j, i in enumerate(split.device_inputs) if i in static]
        piece = self.piece(_compile.make_boxed_func(split.device.forward), split.device,
                           list(split.example_inputs), "inference", inner_static,
                           names=inner)
        return HostPrefixed(split, piece)

    def piece(self, compiled, graph, inputs, kind: str, static,
              names: list[str] | None = None) -> AotGraph:
        if names is None:
            names = self._names(graph, kind)
        if kind == "backward":
            static = self._backward_static(names)
        elif static is None:
            static = _forward_static(len(inputs))
        if kind != "backward":
            self.forward_static = frozenset(static)
        dynamic = any(isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and any(
            isinstance(s, torch.SymInt) for s in v.shape)) for v in inputs)
        name = f"graph {self.number} {kind}"
        mutated = _fx_inspect.mutated_inputs(graph)
        buckets, note = None, None
        if dynamic and self.settings.buckets is not None:
            plan = plan_buckets(graph, inputs, static, mutated, kind, names)
            if isinstance(plan, str):
                note = plan
            else:
                buckets = AotGraphBuckets(plan, self.settings.buckets, compiled, name=name,
                                       static=static, strict=self.settings.strict,
                                       copy_outputs=self.settings.copy_outputs,
                                       check_outputs=self.settings.check_outputs)
        return AotGraph(compiled, name=name, compiler=self.compiler, names=names, static=static,
                     mutated=mutated, dynamic=dynamic,
                     reason=_fx_inspect.uncapturable_reason(graph, inputs, names),
                     settings=self.settings, buckets=buckets, bucket_note=note)

    def _names(self, graph, kind: str) -> list[str]:
        names = _fx_inspect.placeholder_names(graph)
        if kind != "backward" and len(names) == len(self.dynamo_names):
            return self.dynamo_names  # the user's: l_self_modules_fc_parameters_weight_
        return names

    def _backward_static(self, names: list[str]) -> list[int]:
        # A backward reads the forward's inputs it saved as placeholders primals_<k+1>; only
        # those that were static there stay in place. Saved activations are forward outputs,
        # copied out on every call, so they are copied in.
        static = []
        for index, name in enumerate(names):
            if name.startswith("primals_") and name[8:].isdigit():
                if int(name[8:]) - 1 in self.forward_static:
                    static.append(index)
        return static


def _bucket_sizes(opts: CompileOptions) -> tuple[int, ...] | None:
    if opts.buckets is None:
        if opts.max_bucket is not None:
            raise OptionsError("max_bucket", opts.max_bucket, "None unless buckets='pow2' "
                               "(it sets the largest power-of-two bucket)")
        return None
    if opts.buckets == "pow2":
        if opts.max_bucket is None:
            raise OptionsError("max_bucket", None, "the largest bucket (a positive int) with "
                               "buckets='pow2'")
        return resolve_buckets("pow2", opts.max_bucket)
    if opts.max_bucket is not None:
        raise OptionsError("max_bucket", opts.max_bucket, "None with a list of buckets (the "
                           "list's last size is the largest)")
    return resolve_buckets(list(opts.buckets), 1)


def _forward_static(count: int) -> list[int]:
    """AOTAutograd's static inputs of the graph being compiled (parameters, buffers, marked)."""
    context = _compile.tracing_context()
    metadata = getattr(context, "fw_metadata", None) if context is not None else None
    indices = getattr(metadata, "static_input_indices", None)
    return [i for i in indices if i < count] if indices else []


def compile_report() -> list[AotGraphReport]:
    """What the ``"cugraphrt"`` backend did with each piece still in use in this process.

    Returns
    -------
    list of AotGraphReport
        In compilation order; a piece goes away with the compiled code dynamo drops
        (``torch._dynamo.reset()``).
    """
    return [piece.report() for piece in live_aot_graphs()]


def format_compile_report() -> str:
    """:func:`compile_report` as a table, one line per piece."""
    lines = [f"{'piece':<24} {'compiler':<10} {'graphed':<8} {'graphs':>6} {'replays':>8} "
             f"{'rerec':>5}  reason"]
    for r in compile_report():
        reason = r.reason or (f"buckets {list(r.buckets)}" if r.buckets else "")
        if r.bucket_note:
            reason = (reason + "; " if reason else "") + f"no buckets: {r.bucket_note}"
        lines.append(f"{r.name:<24} {r.compiler:<10} {str(r.graphed):<8} {r.graphs:>6} "
                     f"{r.replays:>8} {r.rerecords:>5}  {reason}")
    return "\n".join(lines)
