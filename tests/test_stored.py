"""`tfcli quantize` (tfcli.generate.stored): a checkpoint's linear layers stored as decoding reads them, int8 and
fp32 (the row kernel's layout), mapped at load instead of made there: the same outputs, with the layers never made."""

from __future__ import annotations

import io
import random
import warnings

import pytest
import torch

import tfcli
from helpers import WORDS, save_counter, save_random_translator, stored_layout_decoded
from tfcli import checkpoint, device
from tfcli.generate import int8, native
from tfcli.generate.stored import PARTS


def _needs(dtype: str):
    return pytest.mark.skipif(not stored_layout_decoded(dtype), reason=f"{dtype} decoding's stored layout is not used "
                              "here")


def _cli(*args):
    from typer.testing import CliRunner

    from tfcli.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def _quantize_cli(ckpt, dtype: str):
    return _cli("quantize", ckpt, "--dtype", dtype)


def _never_made(monkeypatch, dtype: str) -> None:
    """Making the layout at load (int8: quantising, fp32: packing) fails the test from here on."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"{dtype} layout made at load")

    if dtype == "int8":
        monkeypatch.setattr(int8, "quantize_weight", refuse)
    else:
        monkeypatch.setattr(native, "pack", refuse)


CASES = [pytest.param("int8", "rows", marks=_needs("int8")), pytest.param("int8", "fbgemm", marks=_needs("int8")),
         pytest.param("fp32", None, marks=_needs("fp32"))]


@pytest.mark.parametrize("dtype,engine", CASES)
def test_a_quantized_checkpoint_decodes_as_before_without_making_its_layers_at_load(dtype, engine, tmp_path,
                                                                                    monkeypatch):
    """`tfcli quantize --dtype D` writes what decoding in D would make at load: mapped from the file (the layers
    never made), the same translations (beam and greedy) and LM outputs; int8 on rows.c's kernel and on fbgemm
    (the blocks read back as rows). Each dtype reads its own file only."""
    if engine is not None:
        if engine == "rows" and native.int8_kernel() is None or engine == "fbgemm" and \
                device.int8_engines()[:1] != ("fbgemm",):
            pytest.skip(f"{engine} does not run here")
        monkeypatch.setattr(int8, "default_engines", lambda: (engine,))
    other = "fp32" if dtype == "int8" else "int8"
    ckpt = save_random_translator(tmp_path, 5)
    lm = save_counter(tmp_path, WORDS[:6])
    rng = random.Random(1)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(20)]
    before = {beam: tfcli.load(str(ckpt), device="cpu", dtype=dtype).translate(texts, beam_size=beam)
              for beam in (4, 1)}
    prompts = [WORDS[0], f"{WORDS[2]} {WORDS[3]}"]
    lm_before = tfcli.load(str(lm), device="cpu", dtype=dtype).generate(prompts, max_new_tokens=8)
    others = {d: tfcli.load(str(ckpt), device="cpu", dtype=d).translate(texts) for d in (other, "bf16")}
    (tmp_path / "in.txt").write_text(texts[0] + "\n")
    verbose = ["translate", "-m", ckpt, "--dtype", dtype, "-v", tmp_path / "in.txt"]
    said = _cli(*verbose).stderr
    assert "stored by tfcli quantize" not in said
    if dtype == "int8":
        assert "int8 (weights quantised at load; tfcli quantize stores them)" in said
    for path in (ckpt, lm):
        res = _quantize_cli(path, dtype)
        assert res.exit_code == 0, res.output
        assert (path / f"model.{dtype}.safetensors").is_file() and f"model.{dtype}.safetensors" in res.output
    _never_made(monkeypatch, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        translator = tfcli.load(str(ckpt), device="cpu", dtype=dtype)
        assert translator.loaded.steps.stored
        assert {beam: translator.translate(texts, beam_size=beam) for beam in (4, 1)} == before
        assert tfcli.load(str(lm), device="cpu", dtype=dtype).generate(prompts, max_new_tokens=8) == lm_before
    monkeypatch.undo()  # (the other dtypes make their own layers)
    if engine is not None:
        monkeypatch.setattr(int8, "default_engines", lambda: (engine,))
    for d, want in others.items():
        translator = tfcli.load(str(ckpt), device="cpu", dtype=d)
        assert not translator.loaded.steps.stored and translator.translate(texts) == want
    assert f"{dtype} (weights stored by tfcli quantize) on cpu" in _cli(*verbose).stderr


def test_the_fp32_file_holds_the_row_kernels_blocks_of_the_decoders_layers_only(tmp_path):
    """model.fp32.safetensors: each of the decoder's linear layers and the output layer as native.pack lays it out
    (rows.c's blocks; tests/test_step.py holds pack to its definition), with its fingerprint; no encoder layer (the
    encoder packs for oneDNN)."""
    if not stored_layout_decoded("fp32"):
        pytest.skip("the fp32 row kernel does not run here")
    from safetensors import safe_open

    ckpt = save_random_translator(tmp_path, 5)
    assert _quantize_cli(ckpt, "fp32").exit_code == 0
    model, _ = checkpoint.load(ckpt, "cpu")
    tensors = checkpoint.read_weights(ckpt / "model.fp32.safetensors")
    names = {k.rsplit(".", 1)[0] for k in tensors}
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert names and names <= linears and not any(n.startswith("encoder") for n in names)
    assert {n for n in linears if n.startswith("decoder.layers.0.")} <= names
    for name in names:
        w = model.get_submodule(name).weight.detach()
        assert torch.equal(tensors[f"{name}.wt"], native.pack(w))
        assert {p: (tuple(t.shape), t.dtype) for p, t in [("wt", tensors[f"{name}.wt"])]} == PARTS["fp32"](*w.shape)
    with safe_open(str(ckpt / "model.fp32.safetensors"), "pt") as f:
        header = f.metadata()
    assert header["format"] == "tfcli-fp32-rows" and header["format_version"] == "1" and len(header["weights"]) == 32


@pytest.mark.parametrize("dtype", [pytest.param(d, marks=_needs(d)) for d in ("int8", "fp32")])
def test_a_stored_file_not_made_from_the_checkpoints_weights_is_ignored_with_a_warning(dtype, tmp_path):
    """Weights replaced after `tfcli quantize`, a file whose layers are not the model's, or one in a newer format: a
    warning naming the file and the fix, and the layers made at load (the translations of the weights there now)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ckpt = save_random_translator(tmp_path / "a", 5)
    other = save_random_translator(tmp_path / "b", 6)
    texts = [" ".join(WORDS[:5]), WORDS[7]]
    want = tfcli.load(str(other), device="cpu", dtype=dtype).translate(texts)
    assert _quantize_cli(ckpt, dtype).exit_code == 0
    (ckpt / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes())
    again = f"`tfcli quantize {ckpt}" + ("`" if dtype == "int8" else " --dtype fp32`")
    with pytest.warns(RuntimeWarning, match=rf"model.{dtype}.safetensors: made from other weights .*{again}"):
        assert tfcli.load(str(ckpt), device="cpu", dtype=dtype).translate(texts) == want
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    assert _quantize_cli(ckpt, dtype).exit_code == 0  # made again from the weights there now: used without a word
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tfcli.load(str(ckpt), device="cpu", dtype=dtype).translate(texts) == want
    path = ckpt / f"model.{dtype}.safetensors"
    with safe_open(str(path), "pt") as f:
        header = f.metadata()
    tensors = load_file(str(path))
    part = next(iter(PARTS[dtype](1, 1)))
    layer = next(k for k in tensors if k.endswith(f".{part}"))[: -len(part)]
    save_file({k.replace(layer, "nowhere."): t for k, t in tensors.items()}, str(path), metadata=header)
    with pytest.warns(RuntimeWarning, match="no layer nowhere"):
        assert tfcli.load(str(ckpt), device="cpu", dtype=dtype).translate(texts) == want
    save_file(tensors, str(path), metadata=header | {"format_version": "99"})
    with pytest.warns(RuntimeWarning, match=f"{dtype} format 99"):
        assert tfcli.load(str(ckpt), device="cpu", dtype=dtype).translate(texts) == want


@pytest.mark.parametrize("dtype", [pytest.param(d, marks=_needs(d)) for d in ("int8", "fp32")])
def test_a_corrupt_stored_file_is_one_line_naming_it(dtype, tmp_path):
    ckpt = save_random_translator(tmp_path, 5)
    (tmp_path / "in.txt").write_text(f"{WORDS[0]} {WORDS[1]}\n")
    (ckpt / f"model.{dtype}.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    res = _cli("translate", "-m", ckpt, "--dtype", dtype, tmp_path / "in.txt")
    assert res.exit_code == 1
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"model.{dtype}.safetensors: unreadable" in errors[0], res.output
    assert "tfcli quantize" in errors[0]


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
def test_quantize_where_the_layout_is_not_decoded_is_one_line_and_writes_nothing(dtype, tmp_path, monkeypatch):
    ckpt = save_random_translator(tmp_path, 5)
    before = sorted(p.name for p in ckpt.iterdir())
    if dtype == "int8":
        monkeypatch.setattr(device, "int8_available", lambda: False)
        why = "no quantised int8 linear layers"
    else:
        monkeypatch.setattr(native, "fp32_kernel", lambda: None)
        why = "the fp32 row kernel does not run here"
    res = _quantize_cli(ckpt, dtype)
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert res.exit_code == 1 and len(errors) == 1 and why in errors[0], res.output
    assert sorted(p.name for p in ckpt.iterdir()) == before


def test_quantize_takes_int8_or_fp32_only(tmp_path):
    res = _quantize_cli(save_random_translator(tmp_path, 5), "bf16")
    assert res.exit_code == 2 and "int8" in res.output and "fp32" in res.output


def test_write_tensors_is_the_safetensors_format():
    """checkpoint.write_tensors, read back by safetensors itself and by checkpoint.read_weights: every dtype the
    stored layouts use, a metadata header, and a tensor that is a view of a larger one."""
    import tempfile

    from safetensors import safe_open

    torch.manual_seed(0)
    big = torch.randn(6, 10)
    tensors = {"b.wt": torch.randn(3, 5, 7), "a.wp": torch.randint(-127, 128, (2, 3, 64, 4), dtype=torch.int8),
               "a.cs": torch.randint(-2**31, 2**31 - 1, (5,), dtype=torch.int32), "view": big[2:4, 3:9],
               "empty": torch.empty(0, 4)}
    buf = io.BytesIO()
    checkpoint.write_tensors(buf, tensors, {"format": "x", "weights": "y"})
    with tempfile.NamedTemporaryFile(suffix=".safetensors") as f:
        f.write(buf.getvalue())
        f.flush()
        with safe_open(f.name, "pt") as g:
            assert g.metadata() == {"format": "x", "weights": "y"}
            assert sorted(g.keys()) == sorted(tensors)
            for k, t in tensors.items():
                assert torch.equal(g.get_tensor(k), t) and g.get_tensor(k).dtype == t.dtype
        from pathlib import Path

        back = checkpoint.read_weights(Path(f.name))
        assert all(torch.equal(back[k], t) for k, t in tensors.items())
