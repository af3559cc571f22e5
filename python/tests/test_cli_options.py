"""The CLI's numeric options and output paths, tried as a new user would: a value out of range is
refused at once with a message that names the option, before any work is done."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "build" / "release" / "apps" / "cli" / "headlight"
MODEL = ROOT / "models" / "detective.safetensors"


def refused(*args):
    r = subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0, f"{args} was accepted: {r.stdout[-300:]}"
    return r.stderr


@pytest.mark.parametrize("args, option", [
    (["heads", MODEL, "--sequences", "0"], "--sequences"),
    (["heads", MODEL, "--threads", "1000"], "--threads"),
    (["heads", MODEL, "--threads", "-4"], "--threads"),
    (["heads", MODEL, "--threads", "1.5"], "--threads"),
    (["prune", MODEL, "--fraction", "2", "--out", "x.safetensors"], "--fraction"),
    (["explain", MODEL, "she", "--sequences", "-1"], "--sequences"),
    (["train", "--steps", "0"], "--steps"),
    (["train", "--dropout", "1"], "--dropout"),
    (["train", "--n-head", "0"], "--n-head"),
    (["train", "--drill-words", "100"], "--drill-words"),
    (["train", "--micro-batches", "-1"], "--micro-batches"),
    (["generate", MODEL, "--top-p", "0"], "--top-p"),
    (["generate", MODEL, "--temperature", "-1"], "--temperature"),
    (["eval", MODEL, "--dtype", "f16"], "--dtype"),
    (["heads", MODEL, "--dtype", "bfloat"], "--dtype"),
    (["sweep", "--dtype", "f64"], "--dtype"),
    (["bench", "attention", "--seq", "0"], "--seq"),
    (["bench", "peak", "--threads", "99999"], "--threads"),
    (["sweep", "--heads", "2,0"], "--heads"),
    (["tokenizer", "train", "--vocab", "10"], "--vocab"),
])
def test_out_of_range_numbers_are_refused_naming_the_option(args, option):
    err = refused(*args)
    assert option in err and ("must be" in err or "expected" in err or "not in" in err), err


@pytest.mark.parametrize("spec", ["bpe:abc", "bpe:", "bpe:12x"])
def test_a_bad_bpe_spec_is_refused(spec, tmp_path):
    err = refused("train", "--tokenizer", spec, "--steps", "1", "--stories", "10",
                  "--out", tmp_path / "m.safetensors")
    assert "--tokenizer" in err and spec in err, err
    assert not (tmp_path / "m.safetensors").exists()


def test_a_report_path_that_is_a_folder_is_refused_before_the_analysis(tmp_path):
    err = refused("explain", MODEL, "Maria went home.", "--report", tmp_path, "--threads", "1")
    assert f"{tmp_path}: is a folder" in err and "internal error" not in err, err
    assert os.listdir(tmp_path) == []


def test_outputs_in_a_missing_folder_are_refused_and_nothing_is_written(tmp_path):
    report = tmp_path / "report.html"
    err = refused("explain", MODEL, "Maria went home.", "--report", report, "--npy",
                  tmp_path / "no" / "such" / "p.npy", "--threads", "1")
    assert str(tmp_path / "no" / "such" / "p.npy") in err, err
    assert os.listdir(tmp_path) == []  # not even the report


@pytest.mark.parametrize("extra", [
    [],  # float32: the blocked layout holds bf16 caches only
    ["--dtype", "bf16", "--head-dim", "48"],  # not a multiple of 32
    ["--dtype", "bf16", "--backward"],  # a cache is not trained
    ["--dtype", "bf16", "--kv-layout", "columns"],  # no such layout
])
def test_a_blocked_cache_it_cannot_hold_is_refused_naming_the_option(extra):
    args = ["bench", "attention", "--seq", "1", "--seq-kv", "64", "--heads", "2", "--runs", "1",
            "--kv-layout", "blocked", *extra]
    err = refused(*args)
    assert "kv-layout" in err and "internal error" not in err, err


def test_the_model_commands_run_in_bf16(tmp_path):
    """eval, heads and sweep with --dtype bf16: the same figures to bf16's precision, and not the
    float32 ones (the option reaches the models)."""
    import json

    def run(*args):
        return json.loads(subprocess.run([str(CLI), *map(str, args), "--json", "--threads", "2"],
                                         capture_output=True, text=True, timeout=120,
                                         check=True).stdout)

    loss = {d: run("eval", MODEL, "--stories", 50, "--dtype", d)["loss"] for d in ("f32", "bf16")}
    assert loss["f32"] != loss["bf16"] and abs(loss["f32"] - loss["bf16"]) < 0.01 * loss["f32"]
    heads = {d: run("heads", MODEL, "--no-ablation", "--sequences", 4, "--dtype", d)["heads"]
             for d in ("f32", "bf16")}
    f32 = [h["importance"] for h in heads["f32"]]
    b16 = [h["importance"] for h in heads["bf16"]]
    assert f32 != b16
    assert max(abs(a - b) for a, b in zip(f32, b16)) < 0.05 * max(f32)
    assert [h["role"] for h in heads["f32"]] == [h["role"] for h in heads["bf16"]]
    # sweep trains its models in mixed precision
    sweep = {d: [r["val_loss"] for r in run("sweep", "--heads", "1,2", "--steps", 20, "--stories",
                                            200, "--n-layer", 1, "--n-embd", 32, "--block-size",
                                            64, "--dtype", d)["sweep"]]
             for d in ("f32", "bf16")}
    assert sweep["f32"] != sweep["bf16"]
    assert max(abs(a - b) for a, b in zip(sweep["f32"], sweep["bf16"])) < 0.01
