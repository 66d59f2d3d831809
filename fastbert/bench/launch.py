"""Triton's compiled-kernel path on a machine with no GPU: a stand-in for its active driver, so that
its JIT runs for real (each kernel compiled for sm_90 by the wheel's ptxas, then "loaded" and
handed to a launcher) while nothing is launched. The launcher records what it is handed, so that
a launch path can be checked against the JIT's own (tests/kernels/test_direct_launch.py), and the
host's cost of a launch up to the driver measured (benchmarks/bench_launch.py). Outside the
interpreter only: under TRITON_INTERPRET=1 no kernel is compiled.

    with stand_in_driver() as fake:
        kernel = fake.jit(fn)          # a JITFunction of a Python function in a file
        ...                            # fake.calls: every launcher call's arguments, in order
"""
from __future__ import annotations

import contextlib
from typing import Iterator, List

MAX_SHARED = 232448  # bytes: an H100's / H200's, what the JIT checks a kernel's shared memory against


class _Launcher:
    """A compiled kernel's launcher: records (or drops) the arguments of each call."""

    def __init__(self, src, metadata) -> None:
        self.driver = StandInDriver.current

    def __call__(self, *args) -> None:
        if self.driver.record:
            self.driver.calls.append(args)


class _Utils:
    def __init__(self) -> None:
        self.loaded = 0

    def get_device_properties(self, device) -> dict:
        return {"max_shared_mem": MAX_SHARED, "multiprocessor_count": 132, "max_num_regs": 65536, "warpSize": 32}

    def load_binary(self, name, kernel, shared, device):
        self.loaded += 1
        # module, function (numbered: which kernel a launch was handed), registers, spills, threads
        return self.loaded, 1000 + self.loaded, 32, 0, 1024

    def unload_module(self, module) -> None:
        pass


class StandInDriver:
    """What Triton's JIT asks of the active driver: an sm_90 target, device 0, stream 77; `calls`,
    each launcher call's arguments (gridX, gridY, gridZ, stream, function, packed metadata, launch
    metadata, enter hook, exit hook, every parameter), kept while `record`."""

    current: "StandInDriver" = None  # type: ignore[assignment]

    def __init__(self, record: bool = True) -> None:
        self.utils = _Utils()
        self.launcher_cls = _Launcher
        self.calls: List[tuple] = []
        self.record = record
        self.kernels: list = []

    def jit(self, fn):
        """A JITFunction of fn (a function in a Python file), whose compiled kernels are let go of
        when the stand-in is."""
        from triton.runtime.jit import JITFunction

        self.kernels.append(JITFunction(fn))
        return self.kernels[-1]

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device) -> int:
        return 77

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")


@contextlib.contextmanager
def stand_in_driver(record: bool = True, kernels=()) -> Iterator[StandInDriver]:
    """Inside the block Triton's active driver is a StandInDriver. kernels: JITFunctions made
    elsewhere (a module's) whose compiled kernels are let go of at the end, as fake.jit's are."""
    from triton.runtime.driver import driver

    fake = StandInDriver(record)
    fake.kernels.extend(kernels)
    previous = getattr(driver, "_active", None)  # None where none was made (reset_active would make one)
    StandInDriver.current = fake
    driver.set_active(fake)
    try:
        yield fake
    finally:
        for kernel in fake.kernels:  # their modules are the stand-in's: nothing for a real driver to unload
            for cache in kernel.device_caches.values():
                for compiled in cache[0].values():
                    compiled.module = None
            kernel.device_caches.clear()
        driver.set_active(previous)
        StandInDriver.current = None  # type: ignore[assignment]
