"""The `workbench` command line: generate and audit, JSON outputs, prompt files, errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.cli import main


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    out = tmp_path_factory.mktemp("pair")
    assert main(["make-random", "--out", str(out), "--kind", "hybrid", "--seed", "3"]) == 0
    return out / "target", out / "drafter"


def run_json(capsys, argv):
    assert main(argv + ["--json", "--quiet"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_generate_json_with_each_drafter_kind(pair, capsys):
    target, drafter = pair
    base = ["generate", "--target", str(target), "--prompt", "def add(a, b):\n", "--max-new-tokens", "24"]
    ar = run_json(capsys, base + ["--method", "ar"])
    assert {"text", "token_ids", "acceptance_lengths", "mean_acceptance", "tokens_per_second"} <= set(ar)
    assert len(ar["token_ids"]) == 24 and ar["mean_acceptance"] == 1.0 and ar["tokens_per_second"] > 0
    oracle = run_json(capsys, base + ["--drafter", "oracle:p=0.5,rank=1,block=8", "--budget", "16"])
    assert oracle["token_ids"] == ar["token_ids"] and oracle["mean_acceptance"] > 1.5
    real = run_json(capsys, base + ["--drafter", str(drafter), "--method", "dflash"])
    assert real["token_ids"] == ar["token_ids"]
    sampled = run_json(capsys, base + ["--drafter", "oracle", "--temperature", "0.8", "--seed", "4"])
    sampled_ar = run_json(capsys, base + ["--method", "ar", "--temperature", "0.8", "--seed", "4"])
    assert sampled["token_ids"] == sampled_ar["token_ids"]


def test_generate_prompt_file_and_trace_out(pair, capsys, tmp_path):
    target, _ = pair
    prompt = tmp_path / "p.txt"
    prompt.write_text("class A:\n")
    trace_path = tmp_path / "trace.json"
    out = run_json(capsys, ["generate", "--target", str(target), "--prompt-file", str(prompt), "--drafter", "oracle",
                            "--max-new-tokens", "12", "--trace-out", str(trace_path)])
    trace = json.loads(trace_path.read_text())
    assert trace["generated_ids"] == out["token_ids"] and trace["prompt_text"] == "class A:\n"


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_audit_reports_identical_and_divergent(pair, capsys, tmp_path, fmt):
    target, _ = pair
    prompts = ["def f(x):\n", "import sys\n", "while True:\n"]
    path = tmp_path / f"prompts.{fmt}"
    path.write_text(json.dumps(prompts) if fmt == "json" else "\n".join(json.dumps({"prompt": p}) for p in prompts))
    base = ["audit", "--target", str(target), "--prompts", str(path), "--drafter", "oracle:p=0.5,rank=1,block=8",
            "--budget", "16", "--max-new-tokens", "40"]
    fork = run_json(capsys, base + ["--recurrent", "fork"])
    assert fork["prompts"] == 3 and fork["identical"] == 3 and fork["divergent"] == []
    unsafe = run_json(capsys, base + ["--recurrent", "unsafe", "--n", "2"])
    assert unsafe["prompts"] == 2 and unsafe["identical"] + len(unsafe["divergent"]) == 2
    assert unsafe["identical"] < 2
    for d in unsafe["divergent"]:
        assert {"prompt_index", "position", "ar_token", "method_token"} <= set(d) and d["ar_token"] != d["method_token"]


def test_audit_reads_humaneval_from_the_package(pair, capsys):
    target, _ = pair
    report = run_json(capsys, ["audit", "--target", str(target), "--prompts", "humaneval", "--n", "1",
                               "--drafter", "oracle", "--max-new-tokens", "8"])
    assert report["prompts"] == 1 and report["identical"] == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--budget", "0"], "budget must be >= 1"),
        (["--temperature", "nan"], "temperature must be a finite number"),
        (["--temperature", "-1"], "temperature must be a finite number"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(pair, capsys, argv, message):
    target, _ = pair
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--target", str(target), "--prompt", "x"] + argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_errors_are_reported_cleanly(pair, capsys, tmp_path):
    target, _ = pair
    assert main(["generate", "--target", str(target), "--prompt", ""]) == 2
    assert "empty prompt" in capsys.readouterr().err
    assert main(["generate", "--target", str(tmp_path / "nope"), "--prompt", "x"]) == 2
    assert "not a directory and not a bundled model" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt field"}\n')
    assert main(["audit", "--target", str(target), "--prompts", str(bad), "--drafter", "oracle"]) == 2
    assert "needs a string 'prompt' field" in capsys.readouterr().err


def test_console_script_entry_point(pair):
    target, _ = pair
    exe = Path(sys.executable).parent / "workbench"
    out = subprocess.run([str(exe), "generate", "--target", str(target), "--prompt", "x = ", "--method", "ar",
                          "--max-new-tokens", "5", "--json", "--quiet"], capture_output=True, text=True, check=True)
    assert len(json.loads(out.stdout)["token_ids"]) == 5


def test_budget_auto_calibrates_and_runs(pair, capsys):
    target, drafter = pair
    out = run_json(capsys, ["generate", "--target", str(target), "--drafter", "oracle:p=0.5,rank=1,block=8",
                            "--prompt", "def g():\n", "--max-new-tokens", "16", "--budget", "auto"])
    assert out["settings"]["budget"] in (8, 16, 32, 64, 128, 256)
