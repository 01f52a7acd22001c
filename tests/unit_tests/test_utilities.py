"""Process-group and model-parallel helpers in the shape of upstream's ``tests/unit_tests/test_utilities``.

World size 1 runs in the test process (a gloo group on CPU, NCCL on GPU). Larger worlds run in
spawned processes through :func:`run_distributed`, which re-raises a child's failure in the parent.
"""

import os
import socket
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
    return "nccl" if torch.cuda.is_available() else "gloo"


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


def _child(rank, world_size, port, fn, args, error_dir, rendezvous):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size)
    )
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


def run_distributed(fn, world_size=2, *args, timeout=300):
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks; raise if any rank fails.

    ``fn`` must be a module-level function (spawned processes import it by name). The ranks meet
    through a file, not MASTER_PORT: a port picked here is free only until the ranks bind it,
    seconds later, and a test run beside this one (``prove --jobs``) could take it meanwhile.
    """
    with tempfile.TemporaryDirectory() as error_dir, tempfile.TemporaryDirectory() as meet:
        ctx = mp.get_context("spawn")
        port = _free_port()
        rendezvous = os.path.join(meet, "rendezvous")
        procs = [
            ctx.Process(target=_child, args=(r, world_size, port, fn, args, error_dir, rendezvous))
            for r in range(world_size)
        ]
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
