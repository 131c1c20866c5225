"""Prints the table of docs/reliability.md, "What breaks a capture": which call of another
thread invalidates a capture underway, in each capture mode. Needs a GPU::

    python docs/experiments/what_breaks_a_capture.py

Thread A begins a capture on its stream, thread B makes one call, then A launches a kernel and
ends the capture; "breaks" means CUDA refused A's end (the capture was invalidated). B's call
runs in B's default capture mode ("global") or, in the last column, with B's mode exchanged
for "relaxed" around it (what cugraphrt does for its own clean-up calls).
"""

from __future__ import annotations

import threading

import cupy
from cupy.cuda import runtime

from cugraphrt._cuda import runtime as _cuda

MODES = {"global": 0, "thread_local": 1}
KERNEL = 'extern "C" __global__ void k_{n}(float* x) {{ x[threadIdx.x] += 1.0f; }}'


class Prepared:
    """What B's calls act on, made before A's capture begins."""

    def __init__(self) -> None:
        self.stream = cupy.cuda.Stream(non_blocking=True)
        with self.stream:
            self.array = cupy.arange(1 << 16, dtype=cupy.float32)
            self.event = self.stream.record()
            graph_stream = cupy.cuda.Stream(non_blocking=True)
            with graph_stream:
                graph_stream.begin_capture()
                self.array += 1
                self.graph = graph_stream.end_capture()  # a cupy.cuda.Graph, instantiated
            runtime.streamBeginCapture(graph_stream.ptr, MODES["thread_local"])
            self.array *= 1
            self.raw_graph = runtime.streamEndCapture(graph_stream.ptr)
        self.stream.synchronize()


_counter = iter(range(1 << 30))


def _calls(p: Prepared):
    host = cupy.asnumpy(p.array)
    return {
        "`cudaDeviceSynchronize`": runtime.deviceSynchronize,
        "`cublasCreate`": lambda: cupy.cuda.cublas.destroy(cupy.cuda.cublas.create()),
        "`cudaMalloc` + `cudaFree`": lambda: runtime.free(runtime.malloc(1 << 20)),
        "`cudaGraphExecDestroy`": lambda: setattr(p, "graph", None),
        "stream synchronize": p.stream.synchronize,
        "`cudaEventQuery`": lambda: p.event.done,
        "device-to-host copy": lambda: p.array.get(stream=p.stream),
        "graph instantiation": lambda: runtime.graphExecDestroy(
            runtime.graphInstantiate(p.raw_graph)),
        "module load (kernel compile)": lambda: cupy.RawKernel(
            KERNEL.format(n=next(_counter)), f"k_{next(_counter) - 1}").compile(),
        "stream creation": lambda: cupy.cuda.Stream(non_blocking=True),
        "`cudaMemGetInfo`": runtime.memGetInfo,
        "host-to-device copy": lambda: p.array.set(host, stream=p.stream),
        "legacy-stream launch": lambda: _on_legacy(p),
    }


def _on_legacy(p: Prepared) -> None:
    with cupy.cuda.Stream.null:
        p.array.view()[:1] += 1


def trial(call_name: str, a_mode: str, b_relaxed: bool, a_blocking: bool = False) -> str:
    p = Prepared()
    call = _calls(p)[call_name]
    a_stream = cupy.cuda.Stream(non_blocking=not a_blocking)
    x = cupy.zeros(256, dtype=cupy.float32)
    began, called = threading.Event(), threading.Event()
    outcome: dict[str, str] = {}

    def thread_a() -> None:
        runtime.streamBeginCapture(a_stream.ptr, MODES[a_mode])
        began.set()
        called.wait(30)
        broken = False
        try:  # an invalidated capture refuses the launch (a driver error) or the end
            with a_stream:
                cupy.add(x, 1, out=x)
        except Exception:  # noqa: BLE001 - the refusal is the answer
            broken = True
        try:
            runtime.graphDestroy(runtime.streamEndCapture(a_stream.ptr))
        except Exception:  # noqa: BLE001 - likewise; the capture is ended either way
            broken = True
        outcome["a"] = "**breaks**" if broken else "fine"

    def thread_b() -> None:
        began.wait(30)
        try:
            if b_relaxed:
                with _cuda.relaxed_capture_mode():
                    call()
            else:
                call()
        except Exception as exc:  # noqa: BLE001 - B's own refusal is not the question
            outcome["b"] = type(exc).__name__
        finally:
            called.set()

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    runtime.deviceSynchronize()
    return outcome.get("a", "hung")


def main() -> None:
    cupy.arange(4) + 1  # kernels and the context, before any capture
    print("| B's call | A in `thread_local` | A in `global`, B default "
          "| A in `global`, B relaxed |")
    print("|---|---|---|---|")
    for name in _calls(Prepared()):
        cells = [trial(name, "thread_local", False), trial(name, "global", False),
                 trial(name, "global", True)]
        print(f"| {name} | " + " | ".join(cells) + " |")
    blocking = trial("legacy-stream launch", "thread_local", False, a_blocking=True)
    print(f"| legacy-stream launch, A's stream *blocking* | {blocking} | — | — |")


if __name__ == "__main__":
    main()
