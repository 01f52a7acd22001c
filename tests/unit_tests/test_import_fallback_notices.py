"""Importing megatron.core without Transformer Engine, Apex or absl raises no UserWarning: each
fallback (torch optimizers, local multi-tensor ops, torch norms, stdlib logging) is reported through
the module's logger instead, at INFO (DEBUG for the absl one), where a training script that wants
it can still see it. A user should only be warned about what asks them to act (issue 47)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import megatron.core

# The source root of the megatron package under test (the checkout, or a prove scratch tree).
SOURCE_ROOT = Path(megatron.core.__file__).resolve().parents[2]

# Every module whose import-time fallback notice was a UserWarning.
MODULES = [
    "megatron.core.optimizer",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.distributed.fsdp.src.megatron_fsdp.mixed_precision",
    "megatron.core.hyper_comm_grid",
    "megatron.core.models.backends",
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.models.gpt.heterogeneous.heterogeneous_layer_specs",
    "megatron.core.models.bert.bert_layer_specs",
    "megatron.core.models.bert.bert_lm_head",
    "megatron.core.models.T5.t5_spec",
    "megatron.core.models.vision.vit_layer_specs",
    "megatron.core.models.multimodal.llava_spec",
]

# Imports the package the way a user does, with every UserWarning an error, and prints, as JSON,
# the log records emitted during the imports and which modules took their fallback branch (read
# from the modules' own flags, so the test holds on a machine that has TE, Apex or absl too).
_SCRIPT = textwrap.dedent(
    """
    import importlib, json, logging, sys

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append([record.name, record.levelno, record.getMessage()])

    root = logging.getLogger()
    root.addHandler(Keep())
    root.setLevel(logging.DEBUG)

    import megatron.core
    import megatron.core.models.gpt
    for name in sys.argv[1:]:
        importlib.import_module(name)

    from megatron.core import hyper_comm_grid, optimizer, utils
    from megatron.core.distributed.fsdp.src.megatron_fsdp import mixed_precision
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as optimizer_module

    local = utils.local_multi_tensor_applier
    mp_applier = getattr(mixed_precision, "multi_tensor_applier", None)
    fell_back = {
        "megatron.core.optimizer": optimizer.USING_PYTORCH_OPTIMIZER,
        "megatron.core.optimizer.optimizer": optimizer_module.multi_tensor_applier is local,
        "megatron.core.optimizer.clip_grads": clip_grads.multi_tensor_applier is local,
        "megatron.core.distributed.fsdp.src.megatron_fsdp.mixed_precision": (
            getattr(mp_applier, "__name__", "") == "local_multi_tensor_applier"
        ),
        "megatron.core.hyper_comm_grid": not hyper_comm_grid.HAVE_ABSL,
    }
    for name in sys.argv[1:]:
        module = sys.modules[name]
        for flag in ("HAVE_APEX", "HAVE_FUSED_LAYER_NORM"):
            if name not in fell_back and hasattr(module, flag):
                fell_back[name] = not getattr(module, flag)
    missing = sorted(set(sys.argv[1:]) - set(fell_back))
    assert not missing, f"no fallback flag read for {missing}"
    print(json.dumps({"records": records, "fell_back": fell_back}))
    """
)


def _import_with_warnings_as_errors():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS",)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SOURCE_ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", _SCRIPT, *MODULES],
        cwd=SOURCE_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_import_raises_no_user_warning_and_logs_the_fallbacks():
    proc = _import_with_warnings_as_errors()
    assert proc.returncode == 0, (
        "importing megatron.core with -W error::UserWarning failed:\n" + proc.stderr[-4000:]
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    records = result["records"]
    fell_back = [name for name, taken in result["fell_back"].items() if taken]

    for name in fell_back:
        notices = [
            (level, message)
            for logger, level, message in records
            if logger == name and "not installed" in message
        ]
        assert notices, f"{name} took its fallback branch but logged no notice; records: {records}"
        level = 10 if name == "megatron.core.hyper_comm_grid" else 20  # DEBUG / INFO
        assert [lvl for lvl, _ in notices] == [level], (name, notices)

