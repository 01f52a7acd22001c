"""Process-group and model-parallel helpers in the shape of upstream's ``tests/unit_tests/test_utilities``.

World size 1 runs in the test process. Larger worlds run in spawned processes through
:func:`run_distributed`, which re-raises a child's failure in the parent.

Device policy, so that one suite runs on a CPU-only machine and on a CUDA host alike: tests build
their models and inputs on :func:`unit_device` (the current CUDA device where there is one); the
default process group is gloo for CPU tensors and, on a CUDA host, NCCL for CUDA tensors; and a
distributed run with more ranks than visible GPUs runs every rank on the CPU (NCCL refuses two
ranks on one device).
"""

import contextlib
import importlib
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _backend() -> str:
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def unit_device() -> torch.device:
    """Where unit tests put models and inputs: the current CUDA device, or the CPU without CUDA."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _ranks_need_cpu(world_size: int) -> bool:
    """True when ``world_size`` ranks cannot each have a GPU of their own (NCCL needs that)."""
    return torch.cuda.is_available() and torch.cuda.device_count() < world_size


class Utils:
    world_size = 1
    rank = 0

    @staticmethod
    def initialize_distributed(init_method=None):
        if dist.is_initialized():
            return
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if torch.cuda.is_available():
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(_backend(), init_method=init_method, rank=rank, world_size=world)
        Utils.rank, Utils.world_size = rank, world

    @staticmethod
    def initialize_model_parallel(
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        virtual_pipeline_model_parallel_size=None,
        seed=123,
        **kwargs,
    ):
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        ps.destroy_model_parallel()
        Utils.initialize_distributed()
        ps.initialize_model_parallel(
            tensor_model_parallel_size,
            pipeline_model_parallel_size,
            virtual_pipeline_model_parallel_size,
            **kwargs,
        )
        model_parallel_cuda_manual_seed(seed)

    @staticmethod
    def destroy_model_parallel():
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()
        _destroy_subgroups()

    @staticmethod
    def destroy_process_group():
        if dist.is_initialized():
            dist.destroy_process_group()


def _destroy_subgroups():
    """Destroy every process group but the default one.

    ``parallel_state.destroy_model_parallel`` forgets its groups without destroying them. On gloo
    each live group keeps three threads polling, and a suite that sets up model parallelism per
    test leaves thousands of them: the machine slows to a crawl.
    """
    if not dist.is_initialized():
        return
    world = dist.group.WORLD
    for group in list(dist.distributed_c10d._world.pg_map):
        if group is not world:
            dist.destroy_process_group(group)


def _child(rank, world_size, port, fn_ref, payload, error_dir, rendezvous, cpu_rank):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size)
    )
    if cpu_rank:
        _without_cuda_only_libraries()
    fn = _resolve(fn_ref)
    args = pickle.loads(payload)
    from tests.unit_tests import cpu_compat

    cpu_compat.install()
    try:
        Utils.initialize_distributed(init_method=f"file://{rendezvous}")
        fn(rank, world_size, *args)
    except BaseException:
        with open(os.path.join(error_dir, f"rank{rank}.txt"), "w") as fh:
            fh.write(traceback.format_exc())
        raise
    finally:
        Utils.destroy_model_parallel()
        Utils.destroy_process_group()


# Libraries whose kernels only take CUDA tensors. Megatron uses them wherever they import (TE's
# router GEMM, TE's and APEX's fused Adam), so a CPU rank on a host that has them would hand them
# CPU tensors; without them it takes the torch paths, as on a CPU-only machine.
_CUDA_ONLY_LIBRARIES = ("transformer_engine", "apex")


def _without_cuda_only_libraries():
    """Make ``import transformer_engine`` / ``import apex`` raise ImportError in this process."""
    for name in _CUDA_ONLY_LIBRARIES:
        if name not in sys.modules:
            sys.modules[name] = None


def _resolve(fn_ref):
    module_name, qualname = fn_ref
    target = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


@contextlib.contextmanager
def _children_environment(hide_cuda: bool):
    """Start spawned ranks without CUDA when ``hide_cuda``: they inherit the environment at start.

    Hidden before the child's first CUDA call, CUDA is simply absent there; with the CUDA-only
    libraries turned away too (``_child``), the rank runs on the CPU with gloo and the CPU
    stand-ins, as on a CPU-only machine.
    """
    if not hide_cuda:
        yield
        return
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def run_distributed(fn, world_size=2, *args, timeout=300, cpu_ranks=None):
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks; raise if any rank fails.

    ``cpu_ranks`` forces the ranks to run as on a CPU-only machine (True) or not (False); by
    default they do when there are more ranks than GPUs. A test whose runs exchange files (a
    checkpoint saved by 2 ranks, loaded by 1) passes the same value to each run.

    ``fn`` must be a module-level function (spawned processes import it by name). The ranks meet
    through a file, not MASTER_PORT: a port picked here is free only until the ranks bind it,
    seconds later, and a test run beside this one (``prove --jobs``) could take it meanwhile.
    """
    # The function travels by name and its arguments as bytes, so that a CPU rank can turn away
    # CUDA-only libraries before anything imports megatron (unpickling would import it first).
    fn_ref = (fn.__module__, fn.__qualname__)
    payload = pickle.dumps(args)
    if cpu_ranks is None:
        cpu_ranks = _ranks_need_cpu(world_size)
    with tempfile.TemporaryDirectory() as error_dir, tempfile.TemporaryDirectory() as meet:
        ctx = mp.get_context("spawn")
        port = _free_port()
        rendezvous = os.path.join(meet, "rendezvous")
        procs = [
            ctx.Process(
                target=_child,
                args=(r, world_size, port, fn_ref, payload, error_dir, rendezvous, cpu_ranks),
            )
            for r in range(world_size)
        ]
        with _children_environment(cpu_ranks):
            for p in procs:
                p.start()
        for p in procs:
            p.join(timeout)
        for p in procs:
            if p.is_alive():
                p.kill()
        errors = [
            open(os.path.join(error_dir, f)).read() for f in sorted(os.listdir(error_dir))
        ]
        codes = [p.exitcode for p in procs]
        if errors or any(c != 0 for c in codes):
            raise AssertionError(
                f"distributed run failed (exit codes {codes}):\n" + "\n".join(errors)
            )


# The first statement of a Python process that runs as on a CPU-only machine (with
# cpu_only_environment()): the CUDA-only libraries turned away before anything imports them.
CPU_ONLY_PREAMBLE = "import sys; sys.modules.update(" + ", ".join(f"{n}=None" for n in _CUDA_ONLY_LIBRARIES) + ")"

# A test session's own rendezvous, which a fresh process must not inherit.
_RENDEZVOUS_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def cpu_only_environment(drop_prefixes=()) -> dict:
    """This process's environment for a fresh one that runs as on a CPU-only machine: no visible
    GPU, no rendezvous variables, and none whose name starts with one of ``drop_prefixes``."""
    env = {k: v for k, v in os.environ.items()
           if k not in _RENDEZVOUS_VARIABLES and not k.startswith(tuple(drop_prefixes))}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def rerun_as_on_a_cpu_only_machine(nodeid: str, timeout: int = 600) -> None:
    """Run the test ``nodeid`` in a fresh pytest process with no GPU and no TE; raise if it fails.

    For tests of CPU-side math that a CUDA host would change (float64 references through modules
    that become TE's on a TE host, say): called first thing on a CUDA host, the test then runs as
    it does on a CPU-only machine.
    """
    env = cpu_only_environment()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = f"{CPU_ONLY_PREAMBLE}; import pytest; sys.exit(pytest.main(sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, "-q", "-p", "no:cacheprovider", "-x", nodeid],
        cwd=root, env=env, capture_output=True, text=True, timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(f"{nodeid} failed as on a CPU-only machine (exit {proc.returncode}):\n"
                             + (proc.stdout + proc.stderr)[-4000:])

