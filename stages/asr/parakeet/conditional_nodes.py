"""CUDA graph WHILE nodes opened in the middle of a torch stream capture.

``while_node(flag)`` is a context manager: the work captured inside it becomes the body of a
conditional WHILE node that the GPU repeats while the 0-dim bool CUDA tensor ``flag`` is true
(checked on entry and after each pass), with no host round trip. Two implementations:

- torch's native API (``CUDAGraph.begin_capture_to_while_node``, in torch builds that have it);
- cuda-python (``cuda.bindings`` 12.x/13.x or the legacy ``cuda`` module), following NeMo's recipe:
  an NVRTC-compiled kernel sets the node's handle from the flag; the node is added with the driver
  API and its body is captured on a fresh stream with ``cudaStreamBeginCaptureToGraph``.

Needs CUDA >= 12.4 and a driver >= 12.6. Not exercised on this project's CI (no GPU there); on
a lent H200 (torch 2.11, cuda-bindings 13.3) the GPU tests, ``scripts/gpu_probe.py`` and the GPU
benchmark check that the graphs give the eager loop's tokens (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

_CONDITION_KERNEL = r"""
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle,
                                                                     unsigned int value);
extern "C" __global__ void voxline_set_while_condition(cudaGraphConditionalHandle handle, const bool* flag)
{
    cudaGraphSetConditional(handle, *flag);
}
"""
_MIN_DRIVER = 12060  # conditional nodes work reliably from driver 12.6 (NeMo's floor)

WhileNode = Callable[[torch.Tensor], contextlib.AbstractContextManager[Any]]


def torch_native_available() -> bool:
    return hasattr(torch.cuda.CUDAGraph, "begin_capture_to_while_node")


@contextlib.contextmanager
def _torch_while(flag: torch.Tensor) -> Iterator[None]:
    graph = torch.cuda.CUDAGraph.get_currently_capturing_graph()
    graph.begin_capture_to_while_node(flag)  # samples the flag on entry
    try:
        yield
        graph.set_conditional_handle_for_current_node(flag)  # ... and after every pass
    finally:
        graph.end_capture_to_conditional_node()


class _CudaPython:
    """The driver/runtime/NVRTC bindings, papering over the 12.x → 13.x signature changes."""

    def __init__(self) -> None:
        try:
            import cuda.bindings as pkg
            from cuda.bindings import driver, nvrtc, runtime  # cuda-python >= 12.6 layout
        except ImportError:
            import cuda as pkg  # type: ignore[no-redef]
            from cuda import cuda as driver  # type: ignore[no-redef]  # legacy cuda-python 12.x
            from cuda import cudart as runtime  # type: ignore[no-redef]
            from cuda import nvrtc  # type: ignore[no-redef]
        self.driver, self.runtime, self.nvrtc = driver, runtime, nvrtc
        version = str(getattr(pkg, "__version__", "12.0.0"))
        self.version = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
        self.edge_data = self.version >= (13, 0)  # 13.x added edge-data parameters
        self._kernel: Any = None
        self._keep_alive: list[Any] = []

    @staticmethod
    def cast(kind: Any, handle: Any) -> Any:
        """Re-type a runtime handle as a driver one (or back); 13.x checks argument types."""
        try:
            return kind(int(handle))
        except (TypeError, ValueError):
            return handle

    @staticmethod
    def ok(result: Any) -> Any:
        """Unwrap ``(err, *values)``; raise on a non-success code."""
        err, *values = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise RuntimeError(f"CUDA call failed: {err!r}")
        if not values:
            return None
        return values[0] if len(values) == 1 else tuple(values)

    def driver_version(self) -> int:
        return int(self.ok(self.driver.cuDriverGetVersion()))

    def capture_info(self, stream: int) -> tuple[Any, Any, list[Any]]:
        values = self.ok(self.runtime.cudaStreamGetCaptureInfo(stream))
        status, graph, deps = values[0], values[2], values[3]
        return status, graph, list(deps or [])

    def kernel(self) -> Any:
        if self._kernel is None:
            import numpy as np

            nvrtc = self.nvrtc
            prog = self.ok(
                nvrtc.nvrtcCreateProgram(
                    _CONDITION_KERNEL.encode(), b"while_condition.cu", 0, [], []
                )
            )
            # No --gpu-architecture: the default virtual arch runs on every GPU with conditionals.
            self.ok(nvrtc.nvrtcCompileProgram(prog, 0, []))
            size = self.ok(nvrtc.nvrtcGetPTXSize(prog))
            ptx = b" " * size
            self.ok(nvrtc.nvrtcGetPTX(prog, ptx))
            ptx_buf = np.frombuffer(ptx, dtype=np.uint8)  # NUL-terminated: nvrtc counts it
            module = self.ok(self.driver.cuModuleLoadData(ptx_buf.ctypes.data))
            self._kernel = self.ok(
                self.driver.cuModuleGetFunction(module, b"voxline_set_while_condition")
            )
            self._keep_alive.append((module, ptx_buf))
        return self._kernel

    def new_stream(self, device: torch.device) -> torch.cuda.ExternalStream:
        """A stream of its own for a loop body. Not ``torch.cuda.Stream()``: that hands out a
        pool of 32 streams in turn, so after enough captures a body could get the very stream
        whose capture encloses it."""
        rt = self.runtime
        raw = self.ok(rt.cudaStreamCreateWithFlags(getattr(rt, "cudaStreamNonBlocking", 1)))
        self._keep_alive.append(raw)
        return torch.cuda.ExternalStream(int(raw), device=device)

    def launch_condition(self, args: Any, stream: int) -> None:
        self.ok(
            self.driver.cuLaunchKernel(
                self.kernel(), 1, 1, 1, 1, 1, 1, 0, stream, args.ctypes.data, 0
            )
        )

    @contextlib.contextmanager
    def while_node(self, flag: torch.Tensor) -> Iterator[None]:
        import numpy as np

        rt, drv = self.runtime, self.driver
        stream = torch.cuda.current_stream(flag.device).cuda_stream
        _, graph, _ = self.capture_info(stream)
        handle = self.ok(rt.cudaGraphConditionalHandleCreate(graph, 0, 0))
        flag_ptr = np.array([flag.data_ptr()], dtype=np.uint64)
        args = np.array([handle.getPtr(), flag_ptr.ctypes.data], dtype=np.uint64)
        self._keep_alive.extend((handle, flag_ptr, args))

        self.launch_condition(args, stream)  # decides whether the loop is entered at all
        _, graph, deps = self.capture_info(stream)
        params = drv.CUgraphNodeParams()
        params.type = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle = self.cast(drv.CUgraphConditionalHandle, handle)
        params.conditional.type = drv.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE
        params.conditional.size = 1
        if self.version == (12, 3):  # 12.3.0 did not allocate the output slot itself
            params.conditional.phGraph_out = [drv.CUgraph()]
        params.conditional.ctx = self.ok(drv.cuCtxGetCurrent())
        graph_d = self.cast(drv.CUgraph, graph)
        deps_d = [self.cast(drv.CUgraphNode, d) for d in deps]
        update = rt.cudaStreamUpdateCaptureDependenciesFlags.cudaStreamSetCaptureDependencies
        if self.edge_data:
            node = self.ok(drv.cuGraphAddNode(graph_d, deps_d, None, len(deps_d), params))
            node_r = self.cast(rt.cudaGraphNode_t, node)
            self.ok(rt.cudaStreamUpdateCaptureDependencies(stream, [node_r], None, 1, update))
        else:
            node = self.ok(drv.cuGraphAddNode(graph_d, deps_d, len(deps_d), params))
            node_r = self.cast(rt.cudaGraphNode_t, node)
            self.ok(rt.cudaStreamUpdateCaptureDependencies(stream, [node_r], 1, update))
        body_graph = self.cast(rt.cudaGraph_t, params.conditional.phGraph_out[0])
        body_stream = self.new_stream(flag.device)
        previous = torch.cuda.current_stream(flag.device)
        self.ok(
            rt.cudaStreamBeginCaptureToGraph(
                body_stream.cuda_stream,
                body_graph,
                None,
                None,
                0,
                rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal,
            )
        )
        torch.cuda.set_stream(body_stream)
        # torch routes allocations to the graph's pool only for streams in *its* capture; the
        # body is a separate capture, so without this the first allocation there calls cudaMalloc
        # mid-capture (not permitted). A pool of its own, never released: the graph replays into
        # these blocks for as long as it lives.
        device = flag.device.index if flag.device.index is not None else torch.cuda.current_device()
        pool = torch.cuda.graph_pool_handle()
        torch._C._cuda_beginAllocateCurrentStreamToPool(device, pool)
        self._keep_alive.append((body_stream, pool))
        try:
            yield
            self.launch_condition(args, body_stream.cuda_stream)  # decides whether to go again
        except BaseException:
            self._close_body(body_stream, previous, device, pool, check=False)
            raise
        self._close_body(body_stream, previous, device, pool, check=True)

    def _close_body(
        self,
        body_stream: torch.cuda.ExternalStream,
        previous: torch.cuda.Stream,
        device: int,
        pool: tuple[int, int],
        *,
        check: bool,
    ) -> None:
        """End the body's capture and give the enclosing capture its stream back — the stream
        first: torch ends its own capture only on the stream it began on, so a body that failed
        and kept its stream current would leave the whole capture (and the thread) open."""
        torch._C._cuda_endAllocateToPool(device, pool)
        torch.cuda.set_stream(previous)
        ended = self.runtime.cudaStreamEndCapture(body_stream.cuda_stream)
        if check:
            self.ok(ended)


_cuda_python: _CudaPython | None = None


def cuda_python_while() -> WhileNode | None:
    """cuda-python's WHILE-node opener when it is installed and the driver is new enough."""
    global _cuda_python
    if not hasattr(torch._C, "_cuda_beginAllocateCurrentStreamToPool"):
        return None  # a body's allocations could not be routed to a pool of its own
    if _cuda_python is None:
        try:
            _cuda_python = _CudaPython()
        except ImportError:
            return None
    try:
        if _cuda_python.driver_version() < _MIN_DRIVER:
            return None
    except Exception:  # noqa: BLE001 - no driver, no context: no conditional nodes
        return None
    return _cuda_python.while_node


def while_node_openers() -> list[tuple[str, WhileNode]]:
    """The available implementations, preferred first: torch-native, then cuda-python."""
    openers: list[tuple[str, WhileNode]] = []
    if torch_native_available():
        openers.append(("torch", _torch_while))
    cp = cuda_python_while()
    if cp is not None:
        openers.append(("cuda-python", cp))
    return openers
