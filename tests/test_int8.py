"""--dtype int8 (tfcli.generate.int8): one activation scale per row, so that a row's result, and a sentence's
translation, never depend on the rest of the batch. Checked against exact integer oracles, on every engine, with and
without the compiled row kernels."""

from __future__ import annotations

import random
import warnings

import pytest
import torch

import tfcli
from helpers import WORDS, save_random_translator
from tfcli import device
from tfcli.generate import int8, native
from tfcli.generate.int8 import LEVELS, Int8Linear, dequantize_rows, quantize_rows

pytestmark = pytest.mark.skipif(not device.int8_available(), reason="this torch build has no int8 linear layers")


def engines() -> list[str]:
    """The engines here that sum exactly: rows.c's where it runs, and this torch build's (on a CPU without AMX
    oneDNN is not chosen, but works where it has VNNI; without, its 16-bit pair sums saturate, and it is never
    used)."""
    out = ["rows"] if native.int8_kernel() is not None else []
    if device.int8_engines()[:1] == ("fbgemm",):
        out.append("fbgemm")
    onednn = getattr(torch.ops, "onednn", None)
    if onednn is not None and hasattr(onednn, "qlinear_pointwise") and torch.backends.mkldnn.is_available() \
            and device.onednn_int8_exact():
        out.append("onednn")
    return out


def oracle(lin: torch.nn.Linear, x: torch.Tensor, residual=None, relu=False) -> torch.Tensor:
    """The int8 layer's result computed from its definition: integer sums exact in float64, then the same fp32
    roundings in the same order (sum * w_scale, * s_r, + b, + residual, ReLU)."""
    w = lin.weight.detach()
    w_scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127
    wq = torch.round(w / w_scale[:, None])
    s = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-30) / LEVELS
    q = torch.round(x / s)
    assert q.abs().max() <= LEVELS
    y = (q.double() @ wq.double().T).float() * w_scale
    y = y * s + lin.bias.detach()
    if residual is not None:
        y = y + residual
    return y.relu() if relu else y


def rows_version(version: str, monkeypatch) -> None:
    """Int8Linear's "rows" engine on rows.c's `version` (linear_int8: AVX-512 VNNI; linear_int8_avx2), or a skip."""
    lib = native.library()
    if native.int8_kernel() is None or lib.linear_int8_supported() < (2 if version == "linear_int8" else 1):
        pytest.skip(f"rows.c's {version} does not run here (no C compiler, or the CPU lacks its instructions)")
    monkeypatch.setattr(native, "int8_kernel", lambda: getattr(lib, version))


@pytest.mark.parametrize("engine", ["fbgemm", "onednn", "linear_int8", "linear_int8_avx2"])
@pytest.mark.parametrize("k, n", [(64, 48), (1024, 48), (37, 130), (2200, 70)])
def test_an_int8_layer_is_its_exact_integer_formula_on_every_engine(engine, k, n, monkeypatch):
    """Every engine, rows.c's int8 kernel in both its versions among them, computes the oracle's integer sums and
    float roundings; rows.c's on every mix of its row tiles (up to 6 rows, then the rest; AVX2 2), with outputs
    past its 64-wide blocks and inputs past its groups of four, and past K * 63 * 127 = 2^24."""
    if engine.startswith("linear_int8"):
        rows_version(engine, monkeypatch)
        engine = "rows"
    elif engine not in engines():
        pytest.skip(f"no {engine} int8 linear in this torch build")
    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n)
    layer, relu = Int8Linear(lin, engines=(engine,)), Int8Linear(lin, relu=True, engines=(engine,))
    counts = (1, 5, 40) if engine != "rows" else (1, 2, 3, 7, 13, 40)
    with torch.inference_mode():
        for rows in counts:
            x = torch.randn(rows, k) * torch.rand(rows, 1) * 4  # rows of different ranges
            assert torch.equal(layer(x), oracle(lin, x))
            r = torch.randn(n, rows).T  # (strided)
            assert torch.equal(relu(x, r), oracle(lin, x, r, relu=True))


def test_a_rows_result_does_not_depend_on_the_other_rows_or_the_engine_chosen_by_their_number():
    """Rows alone, in small calls (fbgemm) and large ones (oneDNN on a CPU with AMX), in either order: the same."""
    torch.manual_seed(1)
    lin = torch.nn.Linear(96, 80)
    layer = Int8Linear(lin)
    x = torch.randn(int8.ONEDNN_MIN_ROWS + 9, 96) * torch.rand(int8.ONEDNN_MIN_ROWS + 9, 1) * 5
    x[3] *= 1000  # one row with a far wider range than the others leaves them as they were
    with torch.inference_mode():
        whole = layer(x)
        assert torch.equal(layer(x.flip(0)).flip(0), whole)
        for i in (0, 3, 7, len(x) - 1):
            assert torch.equal(layer(x[i:i + 1]), whole[i:i + 1])
        assert torch.equal(layer(x[:5]), whole[:5])


def test_int8_stays_within_its_rounding_bound_of_fp32():
    """|y - fp32| <= |x| |dw| + |dx| |w| + |dx| |dw| summed, with half a step of each: a weight row's max/127, an
    input row's max/63."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48)
    x = torch.randn(10, 64) * 3
    with torch.inference_mode():
        y, ref = Int8Linear(lin)(x), lin(x)
        dw = (lin.weight.abs().amax(dim=1) / 127 / 2)[:, None].expand_as(lin.weight)
        dx = x.abs().amax(dim=1, keepdim=True) / LEVELS / 2
        bound = x.abs() @ dw.T + dx * lin.weight.abs().sum(dim=1) + dx * dw.sum(dim=1)
    assert ((y - ref).abs() <= bound + 1e-4).all()
    assert (y - ref).abs().max() > 0  # it really is int8


def test_packing_leaves_torchs_engine_setting_as_it_was():
    before = torch.backends.quantized.engine
    Int8Linear(torch.nn.Linear(8, 8))
    assert torch.backends.quantized.engine == before


def test_long_rows_are_served_by_one_engine():
    """Past K * 63 * 127 = 2^24 the engines' float sums could round differently: one engine serves every call."""
    layer = Int8Linear(torch.nn.Linear(2200, 4), engines=("fbgemm", "onednn"))
    assert layer.fbgemm is None and layer.onednn is not None
    if "rows" in engines():
        layer = Int8Linear(torch.nn.Linear(2200, 4), engines=("rows", "onednn"))
        assert layer.rows is None and layer.onednn is not None
    layer = Int8Linear(torch.nn.Linear(2000, 4), engines=tuple(engines()))
    assert (layer.fbgemm is not None) == ("fbgemm" in engines())


def test_engines_follow_the_cpu(monkeypatch):
    monkeypatch.setattr(device, "cpu_has_amx", lambda: False)
    monkeypatch.setattr(int8, "cpu_has_amx", lambda: False)
    without, default_without = device.int8_engines(), int8.default_engines()
    monkeypatch.setattr(device, "cpu_has_amx", lambda: True)
    monkeypatch.setattr(int8, "cpu_has_amx", lambda: True)
    with_amx, default_with_amx = device.int8_engines(), int8.default_engines()
    if "fbgemm" in without:
        assert without == ("fbgemm",)
        assert with_amx == (("fbgemm", "onednn") if "onednn" in engines() else ("fbgemm",))
    if "rows" in engines():  # rows.c's kernel in fbgemm's place
        assert default_without == ("rows",)
        assert default_with_amx == (("rows", "onednn") if "onednn" in with_amx else ("rows",))
    else:
        assert (default_without, default_with_amx) == (without, with_amx)


def test_the_compiled_row_kernels_give_the_torch_fallbacks_results(monkeypatch):
    if native.library() is None:
        pytest.skip("the row kernels could not be built here (no C compiler)")
    torch.manual_seed(2)
    x = torch.randn(37, 300) * torch.rand(37, 1) * 3
    x[5] = 0  # an all-zero row
    x[6, 3], x[7, 299], x[8, 0] = float("nan"), float("inf"), float("-inf")  # rows that give no numbers: s NaN, q 0
    y = torch.randn(37, 50)
    bias, residual = torch.randn(50), torch.randn(50, 37).T  # a strided residual
    compiled = [quantize_rows(x, as_int8=True), quantize_rows(x, as_int8=False)]
    out = [dequantize_rows(y.clone(), compiled[0][1], bias, residual, relu) for relu in (False, True)]
    out.append(dequantize_rows(y.clone(), compiled[0][1], None, None, False))
    monkeypatch.setattr(native, "library", lambda: None)
    fallback = [quantize_rows(x, as_int8=True), quantize_rows(x, as_int8=False)]
    assert compiled[0][0].dtype == torch.int8 and compiled[1][0].dtype == torch.float32
    for (q, s), (q_ref, s_ref) in zip(compiled, fallback):
        assert torch.equal(q, q_ref) and torch.equal(s.nan_to_num(-1), s_ref.nan_to_num(-1))
        assert s[6:9].isnan().all() and not s[:6].isnan().any() and not q[6:9].any()
    def same(a, b):  # bit for bit, NaN where NaN (the rows of s NaN)
        return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0), b.nan_to_num(0))

    assert same(out[0], dequantize_rows(y.clone(), compiled[0][1], bias, residual, False))
    assert same(out[1], dequantize_rows(y.clone(), compiled[0][1], bias, residual, True))
    assert same(out[2], dequantize_rows(y.clone(), compiled[0][1], None, None, False)) and out[2][6:9].isnan().all()


def test_without_a_compiler_int8_warns_once_and_runs_on_torch_ops(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr("shutil.which", lambda name: None)
    native.library.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert native.library() is None and native.library() is None
        assert len(caught) == 1 and "no C compiler" in str(caught[0].message)
        torch.manual_seed(0)
        lin = torch.nn.Linear(64, 48)
        x = torch.randn(6, 64)
        with torch.inference_mode():
            assert torch.equal(Int8Linear(lin)(x), oracle(lin, x))
    finally:
        native.library.cache_clear()


def test_an_int8_translation_is_the_same_at_every_batch_size_and_order(tmp_path):
    """A random model, whose outputs hinge on small differences: batch 1, 7, 64 and the input reversed give the
    same translations, beam and greedy."""
    ckpt = save_random_translator(tmp_path, 4)
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(40)]
    translator = tfcli.load(str(ckpt), device="cpu", dtype="int8")
    for beam in (5, 1):
        want = translator.translate(texts, beam_size=beam, batch_size=64)
        for batch in (1, 7):
            assert translator.translate(texts, beam_size=beam, batch_size=batch) == want
        assert translator.translate(texts[::-1], beam_size=beam, batch_size=64)[::-1] == want


def test_onednns_isa_setting_keeps_amx_out(monkeypatch):
    """ONEDNN_MAX_CPU_ISA below AMX: oneDNN will not use its tiles, so neither int8's engine choice nor bf16's counts
    on them."""
    from tfcli.torch_compat import cpu_has_amx

    has = cpu_has_amx()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_VNNI")
    assert cpu_has_amx() is False
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx512_core_amx")
    assert cpu_has_amx() == has


# --- the row kernels' cache: what is loaded is what this user built ----------------------------------------------

needs_cc = pytest.mark.skipif(not __import__("shutil").which("cc") and not __import__("shutil").which("gcc"),
                              reason="no C compiler")


def _build_fresh(monkeypatch, cache):
    """native.library run afresh (not its per-process cache) with `cache` as XDG_CACHE_HOME: (library, warnings)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lib = native.library.__wrapped__()
    return lib, [str(w.message) for w in caught]


def _library(cache):
    return next((cache / "tfcli").glob("rows-*.so"))


def _put(path, data: bytes) -> None:
    """`path` holds `data`, as a new file (the old one may be mapped in this process: it must not change)."""
    import os

    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _compile(tmp_path, name: str, code: str):
    import subprocess

    src = tmp_path / f"{name}.c"
    src.write_text(code)
    out = tmp_path / f"{name}.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(out)], check=True)
    return out


@needs_cc
def test_two_processes_starting_together_build_the_kernels_once(tmp_path):
    """torchrun starts its processes together: the first builds under a lock, the others load what it built."""
    import os
    import subprocess
    import sys

    log = tmp_path / "builds.log"
    cc = tmp_path / "cc"
    cc.write_text(f"#!/bin/sh\necho build >> {log}\nsleep 1\nexec gcc \"$@\"\n")
    cc.chmod(0o755)
    env = {**os.environ, "CC": str(cc), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    code = "from tfcli.generate import native; assert native.library() is not None"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert log.read_text().count("build") == 1


@needs_cc
def test_a_killed_builds_leftovers_are_removed_by_the_next_build(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    lib, _ = _build_fresh(monkeypatch, cache)
    path = _library(cache)
    stale = path.with_name(f".{path.name}.tmp-99999")
    stale.write_bytes(b"half a library")
    path.unlink()  # (a build that was killed before it installed anything)
    lib, caught = _build_fresh(monkeypatch, cache)
    assert lib is not None and not caught and not stale.exists() and path.exists()
    assert [p.name for p in (cache / "tfcli").iterdir() if ".tmp-" in p.name] == []


@needs_cc
def test_a_truncated_or_corrupt_library_is_built_again(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    _build_fresh(monkeypatch, cache)
    path = _library(cache)
    good = path.read_bytes()
    for bad in (good[: len(good) // 2], b"\x7fELF garbage" * 100):
        _put(path, bad)
        lib, caught = _build_fresh(monkeypatch, cache)
        assert lib is not None and not caught and path.read_bytes() == good


@needs_cc
def test_a_library_that_loads_but_lacks_a_function_is_built_again(monkeypatch, tmp_path):
    """A library with the right record but without the kernels' functions (an older or foreign build): built
    again, never an AttributeError at the first call."""
    import hashlib

    cache = tmp_path / "cache"
    _build_fresh(monkeypatch, cache)
    path = _library(cache)
    other = _compile(tmp_path, "other", "int something_else(void) { return 1; }\n")
    _put(path, other.read_bytes())
    path.with_name(path.name + ".sha256").write_text(hashlib.sha256(other.read_bytes()).hexdigest() + "\n")
    lib, caught = _build_fresh(monkeypatch, cache)
    assert lib is not None and not caught and hasattr(lib, "quantize_rows") and hasattr(lib, "dequantize_rows")


@needs_cc
def test_a_planted_library_is_never_loaded(monkeypatch, tmp_path):
    """A library that is not the one built (its hash differs from the record), or in a cache folder that others
    may write, is not loaded: its code (here, a constructor that leaves a file) never runs."""
    cache = tmp_path / "cache"
    _build_fresh(monkeypatch, cache)
    path = _library(cache)
    marker = tmp_path / "planted-code-ran"
    planted = _compile(tmp_path, "planted", "#include <stdio.h>\n"
                       f'__attribute__((constructor)) static void run(void) {{ fopen("{marker}", "w"); }}\n'
                       "void quantize_rows(void) {}\nvoid dequantize_rows(void) {}\n")
    _put(path, planted.read_bytes())  # the record still holds the built library's hash
    lib, caught = _build_fresh(monkeypatch, cache)
    assert lib is not None and not marker.exists() and not caught  # built again, the planted file replaced
    # a cache folder that others may write: nothing there is loaded, and the torch fallback runs, with a warning
    _put(path, planted.read_bytes())
    (cache / "tfcli").chmod(0o777)
    lib, caught = _build_fresh(monkeypatch, cache)
    assert lib is None and not marker.exists() and len(caught) == 1 and "not private" in caught[0]


@pytest.mark.parametrize("isa", [0, 1, 2])
def test_rows_c_quantises_weights_as_the_torch_ops_do(isa, monkeypatch):
    """rows.c's quantize_weight, in each of its versions (`isa`: plain C, AVX2, AVX-512): the scales and int8
    weights of the torch ops it replaces, byte for byte (rows of every range, an all-zero one, ties at .5 steps,
    widths past the vectors'), and the same into rows.c's blocks as into plain rows."""
    if native.library() is None:
        pytest.skip("the row kernels could not be built here (no C compiler)")
    if isa > native.vector_isa():
        pytest.skip(f"this CPU (or ATEN_CPU_CAPABILITY) does not run version {isa}")
    monkeypatch.setattr(native, "vector_isa", lambda: isa)
    torch.manual_seed(3)
    w = torch.randn(150, 37) * torch.rand(150, 1) * 3
    w[4] = 0
    w[7, :3] = torch.tensor([127.0, 0.5, -1.5])  # (scale 1: ties round to even)
    w[7, 3:] = 0
    w[9, 0], w[9, 1:] = 127, torch.arange(-18.5, 17.5)  # (scale 1) ties in the vectors' lanes and in the tail
    wq = torch.empty(150, 37, dtype=torch.int8)
    packed = int8._Packed(150, 37) if native.int8_kernel() is not None else None
    scale = int8.quantize_weight(w, wq, packed, rows=64)
    monkeypatch.setattr(native, "library", lambda: None)
    wq_ref = torch.empty(150, 37, dtype=torch.int8)
    scale_ref = int8.quantize_weight(w, wq_ref, rows=64)
    assert torch.equal(wq, wq_ref) and torch.equal(scale[:150], scale_ref) and wq[7, :3].tolist() == [127, 0, -2]
    if packed is not None:
        plain = torch.zeros(packed.wp.size(0) * 64, packed.K4 * 4, dtype=torch.int8)
        plain[:150, :37] = wq_ref  # rows.c's blocks, read back as rows
        assert torch.equal(packed.wp.transpose(1, 2).reshape(-1, packed.K4 * 4), plain)
        assert torch.equal(packed.cs[:150], wq_ref.sum(dim=1, dtype=torch.int32)) and not packed.cs[150:].any()
        assert not scale[150:].any()


def test_pack_and_unpack_are_rows_c_blocks_read_as_rows():
    """int8.pack (the torch layout of rows.c's blocks, for a file written where rows.c does not run) puts w[j, k]
    at block j / 64, group k / 4, lane j % 64, byte k % 4, zeros past the weights; unpack reads it back."""
    torch.manual_seed(0)
    wq = torch.randint(-127, 128, (130, 37), dtype=torch.int8)
    wp, cs = int8.pack(wq)
    assert wp.shape == (3, 10, 64, 4) and cs.shape == (192,)
    for j, k in [(0, 0), (63, 36), (64, 5), (129, 33), (77, 4)]:
        assert wp[j // 64, k // 4, j % 64, k % 4] == wq[j, k]
    assert not wp[2, :, 2:].any() and not wp[:, 9, :, 1:].any()  # past row 130, past column 37
    assert torch.equal(cs[:130], wq.sum(dim=1, dtype=torch.int32)) and not cs[130:].any()
    assert torch.equal(int8.unpack(wp, 130, 37), wq)


@pytest.mark.parametrize("isa", [0, 1, 2, "torch"])
def test_a_weight_row_holding_nan_or_inf_quantises_to_a_nan_scale(isa, monkeypatch):
    """rows.c's quantize_weight (each version) and its torch form: a row with NaN or inf gets scale NaN and q 0
    (converting NaN to an integer is undefined in C), the other rows as ever; Int8Linear refuses such weights."""
    if isa != "torch" and (native.library() is None or isa > native.vector_isa()):
        pytest.skip(f"rows.c's version {isa} does not run here")
    if isa == "torch":
        monkeypatch.setattr(native, "library", lambda: None)
    else:
        monkeypatch.setattr(native, "vector_isa", lambda: isa)
    torch.manual_seed(4)
    w = torch.randn(70, 37)
    w[3, 5], w[40, 36], w[41, 0] = float("nan"), float("inf"), float("-inf")
    wq = torch.full((70, 37), 9, dtype=torch.int8)
    scale = int8.quantize_weight(w, wq)
    bad = [3, 40, 41]
    good = [r for r in range(70) if r not in bad]
    assert scale[bad].isnan().all() and not wq[bad].any()
    want = w[good].abs().amax(dim=1) / 127
    assert torch.equal(scale[good], want) and torch.equal(wq[good], torch.round(w[good] / want[:, None]).to(torch.int8))
    lin = torch.nn.Linear(37, 70)
    with torch.no_grad():
        lin.weight.copy_(w)
    with pytest.raises(tfcli.errors.NotANumber):
        Int8Linear(lin, engines=("fbgemm",) if isa == "torch" else None)
