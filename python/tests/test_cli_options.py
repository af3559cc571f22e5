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
    (["generate", MODEL, "--top-p", "0"], "--top-p"),
    (["generate", MODEL, "--temperature", "-1"], "--temperature"),
    (["bench", "attention", "--seq", "0"], "--seq"),
    (["bench", "peak", "--threads", "99999"], "--threads"),
    (["sweep", "--heads", "2,0"], "--heads"),
    (["tokenizer", "train", "--vocab", "10"], "--vocab"),
])
def test_out_of_range_numbers_are_refused_naming_the_option(args, option):
    err = refused(*args)
    assert option in err and ("must be" in err or "expected" in err), err


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
