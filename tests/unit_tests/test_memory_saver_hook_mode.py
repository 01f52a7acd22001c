"""Importing Megatron must leave torch_memory_saver's hook mode to the user.

torch_memory_saver is not installed in the CPU test environment, so these tests use a stand-in
package with the same observable surface as the real library: a module-level singleton
``torch_memory_saver`` whose ``hook_mode`` is write-only, kept in ``_impl_ctor_kwargs`` until the
first ``region()`` builds ``_impl`` (after which configuring raises). The stand-in also records
every assignment, so a test can tell "unchanged" from "set again to the same value".
"""

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from megatron.core.memory_saver_hook_mode import (
    MEGATRON_HOOK_MODE,
    hook_mode_is_decided,
    megatron_memory_saver_region,
    use_megatron_hook_mode_if_unset,
)

STUB_SOURCE = textwrap.dedent(
    '''
    """Stand-in for torch_memory_saver (tests only)."""
    from contextlib import contextmanager
    from types import SimpleNamespace


    class TorchMemorySaver:
        def __init__(self):
            self._impl_ctor_kwargs = {}
            self._impl = None
            self.assignments = []

        @property
        def hook_mode(self):
            raise AttributeError("hook_mode is write-only")

        @hook_mode.setter
        def hook_mode(self, mode):
            assert getattr(self, "_impl_ctor_kwargs", None) is not None, "configured after first use"
            self.assignments.append(mode)
            self._impl_ctor_kwargs["hook_mode"] = mode

        @contextmanager
        def region(self, tag="default", enable_cpu_backup=False):
            if self._impl is None:
                mode = self._impl_ctor_kwargs.get("hook_mode", "preload")
                self._impl = SimpleNamespace(hook_mode=mode)
                del self._impl_ctor_kwargs
            yield


    torch_memory_saver = TorchMemorySaver()
    '''
)

IMPORT_SCRIPT = textwrap.dedent(
    '''
    import json, sys
    from torch_memory_saver import torch_memory_saver as tms

    user_mode = sys.argv[1]
    if user_mode != "none":
        tms.hook_mode = user_mode

    import megatron.core
    from megatron.core.models.gpt import GPTModel
    import megatron.training.training as training
    from megatron.core.inference.contexts import dynamic_context

    report = {
        "assignments_after_import": list(tms.assignments),
        "pending_after_import": dict(tms._impl_ctor_kwargs),
        "have_tms": [dynamic_context.HAVE_TORCH_MEMORY_SAVER, training.HAVE_TORCH_MEMORY_SAVER],
        "same_saver": dynamic_context.torch_memory_saver is tms and training.torch_memory_saver is tms,
    }
    # How Megatron opens its KV cache's region (training's offloaded inference model: the same).
    with dynamic_context.megatron_memory_saver_region(dynamic_context.torch_memory_saver, tag="kv_cache"):
        pass
    report["mode_in_use"] = tms._impl.hook_mode
    report["training_opens_regions_the_same_way"] = (
        training.megatron_memory_saver_region is dynamic_context.megatron_memory_saver_region)
    print("REPORT" + json.dumps(report))
    '''
)


def _new_stub_saver():
    namespace = {}
    exec(compile(STUB_SOURCE, "<torch_memory_saver stand-in>", "exec"), namespace)
    return namespace["TorchMemorySaver"]()


class TestHookModeAtUse:
    def test_unset_mode_gets_torch(self, caplog):
        saver = _new_stub_saver()
        assert not hook_mode_is_decided(saver)
        with caplog.at_level(logging.INFO, logger="megatron.core.memory_saver_hook_mode"):
            assert use_megatron_hook_mode_if_unset(saver) is True
        assert saver.assignments == [MEGATRON_HOOK_MODE] == ["torch"]
        # The user is told which mode Megatron picked for them.
        assert [r.getMessage() for r in caplog.records] == [
            "torch_memory_saver: no hook mode chosen; using 'torch'"]
        with saver.region(tag="kv"):
            pass
        assert saver._impl.hook_mode == "torch"

    @pytest.mark.parametrize("user_mode,mode_in_use", [(None, "torch"), ("preload", "preload")])
    def test_megatron_region_chooses_the_mode_before_opening(self, user_mode, mode_in_use):
        saver = _new_stub_saver()
        if user_mode:
            saver.hook_mode = user_mode
        with megatron_memory_saver_region(saver, tag="kv", enable_cpu_backup=True):
            assert saver._impl.hook_mode == mode_in_use
        assert saver.assignments == [user_mode or MEGATRON_HOOK_MODE]

    @pytest.mark.parametrize("user_mode", ["preload", "torch"])
    def test_user_choice_is_kept(self, user_mode, caplog):
        saver = _new_stub_saver()
        saver.hook_mode = user_mode
        assert hook_mode_is_decided(saver)
        with caplog.at_level(logging.INFO, logger="megatron.core.memory_saver_hook_mode"):
            assert use_megatron_hook_mode_if_unset(saver) is False
        assert caplog.records == [], "nothing was chosen, so nothing is logged"
        assert saver.assignments == [user_mode]
        with saver.region(tag="kv"):
            pass
        assert saver._impl.hook_mode == user_mode

    def test_saver_already_in_use_is_left_alone(self):
        saver = _new_stub_saver()
        with saver.region(tag="user"):  # the user's first region fixes the library default
            pass
        assert hook_mode_is_decided(saver)
        assert use_megatron_hook_mode_if_unset(saver) is False  # would raise if it tried to set
        assert saver.assignments == [] and saver._impl.hook_mode == "preload"

    def test_unrecognised_saver_is_left_alone(self):
        class OtherSaver:
            def __setattr__(self, name, value):
                raise AssertionError(f"{name} must not be set")

        assert hook_mode_is_decided(OtherSaver())
        assert use_megatron_hook_mode_if_unset(OtherSaver()) is False


class TestImportLeavesHookModeAlone:
    @pytest.mark.slow
    @pytest.mark.parametrize(
        "user_mode,mode_in_use", [("preload", "preload"), ("none", "torch")]
    )
    def test_import_megatron_core_gpt_model_and_training(self, tmp_path, user_mode, mode_in_use):
        stub_dir = tmp_path / "site"
        (stub_dir / "torch_memory_saver").mkdir(parents=True)
        (stub_dir / "torch_memory_saver" / "__init__.py").write_text(STUB_SOURCE)
        script = tmp_path / "import_megatron.py"
        script.write_text(IMPORT_SCRIPT)
        repo_root = Path(__file__).resolve().parents[2]
        pythonpath = os.pathsep.join([str(stub_dir), str(repo_root), os.environ.get("PYTHONPATH", "")])
        child = subprocess.run(
            [sys.executable, str(script), user_mode],
            cwd=repo_root,
            env={**os.environ, "PYTHONPATH": pythonpath},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-5000:]
        line = next(l for l in child.stdout.splitlines() if l.startswith("REPORT"))
        report = json.loads(line[len("REPORT") :])

        expected_assignments = [] if user_mode == "none" else [user_mode]
        assert report["assignments_after_import"] == expected_assignments
        expected_pending = {} if user_mode == "none" else {"hook_mode": user_mode}
        assert report["pending_after_import"] == expected_pending
        # The saver is still detected, so Megatron's own TMS paths stay available.
        assert report["have_tms"] == [True, True]
        assert report["same_saver"]
        assert report["mode_in_use"] == mode_in_use
        assert report["training_opens_regions_the_same_way"]
