"""The decoding backends against the model's full forward, on configs generated from ModelConfig's fields.

Every field's values come from its type (a Literal's values, False and True), or for sizes and numbers from
SAMPLES below; a pairwise covering set of valid configs is drawn from them (every pair of values of any two fields
appears in some config, where a valid config can hold it). Each config's model runs on every backend this machine
has (tfcli.generate.backend), and each must give the full forward's greedy ids, with its logits close (int8:
within its quantisation error). A new Literal or bool field is covered without a line here; a new field of another
type fails `test_every_field_has_values` until SAMPLES gives it values, and sends every backend that does not
declare it to the eager path (`test_a_field_no_backend_declares_runs_on_the_eager_path`)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import random
import typing
import warnings

import pytest
import torch
from torch import nn

from tfcli.device import int8_available, onednn_available
from tfcli.generate import backend, native
from tfcli.generate.step import StepModel
from tfcli.model.config import ModelConfig, RopeScaling
from tfcli.model.transformer import build_model
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID

V = 37
SAMPLES = {  # the fields that are not a Literal or a bool: the values tried
    "src_vocab_size": [V], "tgt_vocab_size": [V], "d_model": [32, 48], "n_head": [2, 4], "n_kv_head": [None, 1, 2],
    "n_encoder_layers": [1, 2], "n_decoder_layers": [1, 2], "d_ff": [40, 64], "dropout": [0.0, 0.1],
    "attn_dropout": [0.0, 0.1], "max_len": [16, 64], "layer_norm_eps": [1e-5, 0.1], "head_dim": [None, 8, 24],
    "rope_theta": [10000.0, 500000.0], "qkv_bias": [None, False, True], "sliding_window": [None, 3, 6],
    "global_every": [0, 2], "rope_local_theta": [None, 1000.0], "attn_scale": [None, 0.3], "attn_softcap": [None, 2.0],
    "final_softcap": [None, 3.0],
    "rope_scaling": [None, RopeScaling("linear", 4.0), RopeScaling("llama3", 8.0, 1.0, 4.0, 16),
                     # (four frequencies: RoPE over 8 dimensions; every prompt past 2 positions: the long ones
                     # throughout, in a full forward as in a step; the switch between: tests/test_interop.py)
                     RopeScaling("longrope", 4.0, original_max_len=2, short_factor=(1.0, 1.5, 2.0, 3.0),
                                 long_factor=(2.0, 4.0, 8.0, 16.0))],
    "rotary_dim": [None, 8],
}
STEPS = 6  # greedy steps a sentence (within the smallest max_len)
TOLERANCE = dict(atol=1e-4, rtol=1e-4)  # fp32 logits: the same sums in other orders
# int8 against its oracle, |error| / the largest |logit|: the two agree to 1e-6 but where an input lies at a
# rounding level's midpoint, which their fp32 activations (1e-7 apart) may take on different sides: one level (1/63
# of a row's largest value) of one element moves that step's logits by up to a few percent in these small models
# (seen: 0.7% at ATEN_CPU_CAPABILITY=default; 6.5% on a 48-wide post-norm GeGLU model), and a flip in a cached key
# lives on in every later step (seen: 2-4% at all six steps after one at the first). A wrong kernel errs by more:
# no step may be off by more than INT8_BOUND.
INT8_BOUND = 0.1


def field_values(field: dataclasses.Field) -> list:
    hint = typing.get_type_hints(ModelConfig)[field.name]
    if typing.get_origin(hint) is typing.Literal:
        return list(typing.get_args(hint))
    if hint is bool:
        return [False, True]
    return SAMPLES.get(field.name, [])


def valid(fields: dict) -> bool:
    try:
        ModelConfig(**fields).validate()
    except Exception:
        return False
    return fields["max_len"] >= STEPS + 8  # (room for the prompts and the steps)


def c_kernel_shape(fields: dict) -> bool:
    """rows.c's attention (and so decode_layers) takes head sizes of a multiple of 8."""
    return (fields["head_dim"] or fields["d_model"] // fields["n_head"]) % 8 == 0


def covering_configs(domains: dict, ok=valid, seed: int = 0, tries: int = 400) -> list[dict]:
    """A pairwise covering set over `domains` (field -> values): greedily, the random config (valid: `ok`) that
    covers the most pairs not yet covered, until every pair that some valid config holds is covered."""
    rng = random.Random(seed)
    names = list(domains)

    def draw(fixed: dict) -> dict | None:
        for _ in range(tries):
            fields = {n: fixed.get(n, rng.choice(domains[n])) for n in names}
            if ok(fields):
                return fields
        return None

    def pairs(fields: dict) -> set:
        return {((a, fields[a]), (b, fields[b])) for a, b in itertools.combinations(names, 2)}

    todo = {((a, x), (b, y)) for a, b in itertools.combinations(names, 2) for x in domains[a] for y in domains[b]}
    configs = []
    while todo:
        candidates = [draw({}) for _ in range(30)]
        (a, x), (b, y) = min(todo, key=repr)  # (and one built to hold a pair still open)
        candidates.append(draw({a: x, b: y}))
        if candidates[-1] is None:  # no valid config holds it (rope in an encoder-decoder)
            todo.discard(((a, x), (b, y)))
            continue
        best = max((c for c in candidates if c is not None), key=lambda c: len(pairs(c) & todo))
        todo -= pairs(best)
        configs.append(best)
    return configs


def domains(backend_name: str | None = None) -> dict:
    """Every field's values, or those `backend_name` implements (its row in backend.IMPLEMENTS)."""
    out = {}
    for f in dataclasses.fields(ModelConfig):
        values = field_values(f)
        implemented = backend.IMPLEMENTS.get(f.name, {}).get(backend_name, backend.ANY)
        out[f.name] = [v for v in values if implemented is backend.ANY or v in implemented]
    return out


# every field and value on the eager path and the backends that implement them all; and pairwise again within the
# values decode_layers implements (it runs few of the general set's configs), at the head sizes its kernels take
GENERAL = covering_configs(domains())
WHOLE = covering_configs(domains("whole"), ok=lambda f: valid(f) and c_kernel_shape(f))
CONFIGS = GENERAL + WHOLE

# name -> StepModel options; each runs where this machine has its parts (plan checked in the test)
VARIANTS = {
    "eager plain": dict(allow=()),
    "eager packed": dict(pack=True, allow=()),
    "rows + c_attention": dict(pack=True, allow=("rows", "c_attention")),  # (each alone: a mix of these)
    "whole": dict(pack=True),
    "int8": dict(int8=True),
    "static": dict(static=True, allow=("static",)),
    "static packed": dict(static=True, pack=True),
}


def random_model(fields: dict):
    """The config's model with every weight random (N(0, 0.3); gains around 1), in eval mode."""
    torch.manual_seed(1)
    model = build_model(ModelConfig(**fields)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("norm.weight") else 0.0))
    return model


def int8_oracle(model):
    """The model's full forward with int8's arithmetic in every linear layer (tfcli.generate.int8: each weight row
    rounded to 127 levels of its largest |w|, each input row to 63 of its largest |x|), the integer sums in float64:
    what --dtype int8 computes, up to the float rounding around it."""
    oracle = copy.deepcopy(model)
    for m in oracle.modules():
        if isinstance(m, nn.Linear):
            w = m.weight.detach().double()
            scale = w.abs().amax(1).clamp(min=1e-12) / 127
            m.forward = functools.partial(_int8_linear, torch.round(w / scale[:, None]), scale, m.bias)
    return oracle


def _int8_linear(wq, w_scale, bias, x):
    rows = x.reshape(-1, x.size(-1)).double()
    s = rows.abs().amax(1, keepdim=True).clamp(min=1e-30) / 63
    y = (torch.round(rows / s) @ wq.T) * s * w_scale
    if bias is not None:
        y = y + bias.double()
    return y.float().view(*x.shape[:-1], -1)


def inputs(cfg: ModelConfig) -> torch.Tensor:
    """Three sources (seq2seq) or prompts (lm) of 5, 3 and 4 tokens, padded (sources on the right, prompts on the
    left)."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(4, V, (3, 5), generator=g)
    for r, n in ((1, 3), (2, 4)):
        if cfg.kind == "seq2seq":
            ids[r, n - 1], ids[r, n:] = EOS_ID, PAD_ID
        else:
            ids[r, : 5 - n] = PAD_ID
    return ids


def full_logits(model, cfg: ModelConfig, ids: torch.Tensor, row: int, out: list[int]) -> torch.Tensor:
    """The next-token logits after row `row`'s input and `out`, by the model's full forward (no cache)."""
    if cfg.kind == "seq2seq":
        return model(ids[row : row + 1], torch.tensor([[BOS_ID, *out]]))[0, -1]
    prompt = [t for t in ids[row].tolist() if t != PAD_ID]  # (a prefix LM's prefix: model.prefix_attention)
    return model(torch.tensor([prompt + out]), prefix=torch.tensor([len(prompt)]))[0, -1]


def choose(logits: torch.Tensor) -> torch.Tensor:
    """Greedy choice with decoding's bans (<pad>, <s>, and </s>: every sentence runs all the steps)."""
    logits = logits.clone()
    logits[..., [PAD_ID, BOS_ID, EOS_ID]] = float("-inf")
    return logits.argmax(-1)


def decode(sm: StepModel, cfg: ModelConfig, ids: torch.Tensor, model, int8: bool, memo: dict):
    """Greedy steps of the three rows, row 1 leaving after the second: each row's ids, and per step the largest
    logit error against the full forward (int8: `int8_oracle`'s) on the same history, relative to its largest
    logit. `memo`: the full forward's logits by (oracle, row, history), shared by the variants."""
    rows, out, errors = [0, 1, 2], [[], [], []], []
    if int8:
        if "oracle" not in memo:
            memo["oracle"] = int8_oracle(model)
        model = memo["oracle"]
    with torch.inference_mode():
        if cfg.kind == "seq2seq":
            dec = sm.start(3, 1, STEPS + 1, *sm.encode(ids))
            logits = dec.step(torch.full((3,), BOS_ID))
        else:
            dec = sm.start(3, 1, ids.size(1) + STEPS + 1)
            logits = dec.prefill(ids, ids != PAD_ID)
        for t in range(STEPS):
            ref = torch.stack([reference(memo, (int8, r, tuple(out[r])), model, cfg, ids) for r in rows])
            if int8:
                errors.append(float((logits - ref).abs().max() / ref.abs().max()))
            else:
                torch.testing.assert_close(logits, ref, **TOLERANCE)
            nxt = choose(ref if int8 else logits)  # (int8: along its oracle's greedy path)
            for i, r in enumerate(rows):
                out[r].append(int(nxt[i]))
            if t == 1:
                dec.select(torch.tensor([0, 2]))
                rows, nxt = [0, 2], nxt[[0, 2]]
            if t < STEPS - 1:
                logits = dec.step(nxt)
        dec.release()
    return out, errors


def reference(memo: dict, key: tuple, model, cfg: ModelConfig, ids: torch.Tensor) -> torch.Tensor:
    """full_logits for key (int8, row, history), computed once."""
    if key not in memo:
        memo[key] = full_logits(model, cfg, ids, key[1], list(key[2]))
    return memo[key]


def reference_greedy(model, cfg: ModelConfig, ids: torch.Tensor) -> list[list[int]]:
    out = [[], [], []]
    with torch.inference_mode():
        for r in range(3):
            for _ in range(STEPS if r != 1 else 2):
                out[r].append(int(choose(full_logits(model, cfg, ids, r, out[r]))))
    return out


def expected_plan(variant: str, cfg: ModelConfig) -> dict:
    """What backend.choose must pick for the variant on this machine: each backend where it is asked for, its
    parts are here, and its table has the config."""
    opts = VARIANTS[variant]
    allow = opts.get("allow", backend.BACKENDS)
    fits = {b: b in allow and not backend.unimplemented(b, cfg) for b in backend.BACKENDS}
    static = opts.get("static", False) and fits["static"]
    int8 = opts.get("int8", False) and fits["int8"]
    packed = opts.get("pack", False) and not int8 and onednn_available()
    rows = packed and fits["rows"] and native.fp32_kernel() is not None
    c = (fits["c_attention"] and not static and cfg.d_head % 8 == 0 and native.attention_kernel() is not None)
    return dict(linear="int8" if int8 else "rows" if rows else "packed" if packed else "plain",
                attention="c" if c else "torch", whole=rows and c and fits["whole"], static=static)


FIELDS = {f.name: f for f in dataclasses.fields(ModelConfig)}


@pytest.mark.parametrize("index", range(len(CONFIGS)))
def test_every_backend_gives_the_full_forwards_greedy_ids(index):
    fields = CONFIGS[index]
    model = random_model(fields)
    cfg = model.cfg
    ids = inputs(cfg)
    want = reference_greedy(model, cfg, ids)
    ran, memo = set(), {}
    for variant, opts in VARIANTS.items():
        if opts.get("int8") and not int8_available():
            continue
        sm = StepModel(model, **opts)
        plan = dataclasses.asdict(sm.plan)
        plan.pop("encoder"), plan.pop("declined")
        assert plan == expected_plan(variant, cfg), variant
        key = tuple(plan.values())
        if key in ran:  # (a variant this machine runs as another)
            continue
        ran.add(key)
        got, errors = decode(sm, cfg, ids, model, sm.plan.linear == "int8", memo)
        if sm.plan.linear == "int8":
            assert max(errors) <= INT8_BOUND, (variant, errors)
        else:
            assert got == want, (variant, fields)


def test_the_configs_cover_every_pair_of_values():
    """Every value of every field appears, and every pair of two fields' values that a valid config can hold."""
    names = [f.name for f in dataclasses.fields(ModelConfig)]
    seen = {(n, c[n]) for c in GENERAL for n in names}
    assert seen == {(f.name, v) for f in dataclasses.fields(ModelConfig) for v in field_values(f)}
    lm_only = [("positions", "rope"), ("prefix_attention", True),
               *((name, v) for name in ("sliding_window", "attn_scale", "attn_softcap", "final_softcap")
                 for v in SAMPLES[name] if v)]
    not_rope = {("kind", "seq2seq"), *(("positions", p) for p in field_values(FIELDS["positions"]) if p != "rope")}
    for a, b in itertools.combinations(names, 2):  # (rope, prefix attention, sliding windows, scales and caps:
        # language models only)
        held = {(c[a], c[b]) for c in GENERAL}
        possible = {(x, y) for x in field_values(FIELDS[a]) for y in field_values(FIELDS[b])
                    if not any({(a, x), (b, y)} >= {only, ("kind", "seq2seq")} for only in lm_only)
                    and not ({(a, x), (b, y)} & {("rotary_dim", 8)} and {(a, x), (b, y)} & not_rope)}
        assert held >= possible, (a, b, possible - held)
    assert not any(c["positions"] == "rope" and c["kind"] == "seq2seq" for c in CONFIGS)
    if native.layers_kernel() is not None:  # decode_layers runs on each of its configs
        assert all(not backend.unimplemented("whole", ModelConfig(**c)) for c in WHOLE)
        assert {c["activation"] for c in WHOLE} == {"relu", "relu2", "gelu", "silu"}
    assert len(CONFIGS) < 80  # (pairwise, not the product)


def test_every_field_has_values_and_a_row_in_the_backends_table():
    """A field added to ModelConfig needs values here (SAMPLES, if not a Literal or a bool) and a row in
    backend.IMPLEMENTS saying which backends implement it; the table holds no field that is gone."""
    fields = dataclasses.fields(ModelConfig)
    assert all(field_values(f) for f in fields), [f.name for f in fields if not field_values(f)]
    assert set(backend.IMPLEMENTS) == {f.name for f in fields}
    assert all(set(row) <= set(backend.BACKENDS) for row in backend.IMPLEMENTS.values())


@dataclasses.dataclass
class WithANewField(ModelConfig):
    """ModelConfig as it would be with a field no backend's table has heard of."""

    parallel_residual: bool = False


@pytest.mark.parametrize("value", [False, True])
def test_a_field_no_backend_declares_runs_on_the_eager_path(value):
    """Whatever its value (its default too: nobody has said the backends compute the old way at it), a field that
    IMPLEMENTS lacks keeps every backend from running the model: torch's operators over the layers run it, int8
    asked for runs in fp32 with a warning, and fixed shapes asked for are not used."""
    cfg = WithANewField(src_vocab_size=V, tgt_vocab_size=V, d_model=32, n_head=4, d_ff=64, parallel_residual=value)
    cpu = torch.device("cpu")
    plan = backend.choose(cfg, cpu, torch.float32, pack=True, static=True)
    assert (plan.linear, plan.attention, plan.whole, plan.static) == (
        "packed" if onednn_available() else "plain", "torch", False, False)
    assert all(f"parallel_residual={value!r}" in d for d in plan.declined)
    with pytest.warns(RuntimeWarning, match="int8 is not implemented for this model"):
        assert backend.choose(cfg, cpu, torch.float32, int8=True).linear == "plain"
    sm = StepModel(build_model(cfg).eval(), pack=True, int8=False, static=True)  # (the model ignores the field)
    assert sm.plan == plan and sm.layer_args is None and sm.attend_rows is None
    known = ModelConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(ModelConfig)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert backend.choose(known, cpu, torch.float32, pack=True, static=True).static
